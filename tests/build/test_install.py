"""Installing wheels into a staging venv with real uv: layout, shebangs, RECORD, determinism,
overlaps."""

from __future__ import annotations

import base64
import csv
import getpass
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.wheels import make_wheel, ref

from envbuild.build.install import install, write_venv
from envbuild.build.overlaps import find_overlaps, resolve_overlaps
from envbuild.errors import OverlapError
from envbuild.installed.venv import VenvTarget
from envbuild.installed.wheelpaths import wheel_files

TARGET = VenvTarget(venv="/opt/venv", interpreter="/usr/bin/python3", python_version="3.11")
SITE = "opt/venv/lib/python3.11/site-packages"


@pytest.fixture
def wheels(tmp_path: Path) -> dict[str, Path]:
    d = tmp_path / "wheels"
    return {
        "hello": make_wheel(
            d,
            "hello-tool",
            "1.0",
            {"hello_tool/__init__.py": "def main():\n    print('hello')\n"},
            scripts={"hello": "hello_tool:main"},
        ),
        "plain": make_wheel(d, "plain", "2.0", {"plain.py": "X = 1\n"}),
    }


def tree(root: Path) -> dict[str, tuple[int, bytes]]:
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in [*files, *_dirs]:
            p = Path(dirpath) / name
            st = p.lstat()
            data = (
                os.readlink(p).encode()
                if p.is_symlink()
                else (b"" if p.is_dir() else p.read_bytes())
            )
            out[str(p.relative_to(root))] = (st.st_mode, data)
    return out


def test_install_lays_out_the_image_venv(tmp_path: Path, wheels: dict[str, Path]) -> None:
    root = tmp_path / "stage"
    done = install([(ref(w), w) for w in wheels.values()], TARGET, root)
    assert done.dists == ["hello-tool", "plain"]
    script = root / "opt/venv/bin/hello"
    text = script.read_text()
    assert text.startswith("#!/opt/venv/bin/python\n")
    assert (root / SITE / "plain.py").read_text() == "X = 1\n"
    assert not (root / "opt/venv/.lock").exists()
    assert not list(root.rglob("uv_cache.json"))
    # the rewritten script's RECORD line carries its new hash
    record = root / SITE / "hello_tool-1.0.dist-info/RECORD"
    rows = {r[0]: r for r in csv.reader(record.read_text().splitlines())}
    digest = base64.urlsafe_b64encode(hashlib.sha256(script.read_bytes()).digest()).rstrip(b"=")
    assert rows["../../../bin/hello"][1:] == [f"sha256={digest.decode()}", str(len(text))]
    assert not any("uv_cache" in k for k in rows)
    # nothing of the host: the staging path, the helper interpreter, the user
    needles = [str(root).encode(), sys.executable.encode(), f"/home/{getpass.getuser()}".encode()]
    for path, (_mode, data) in tree(root).items():
        for needle in needles:
            assert needle not in data, (path, needle)


def test_install_is_the_same_under_another_umask_tz_and_cwd(
    tmp_path: Path, wheels: dict[str, Path]
) -> None:
    first = tmp_path / "a"
    install([(ref(w), w) for w in wheels.values()], TARGET, first)
    second = tmp_path / "b"
    code = (
        "import sys; from pathlib import Path; from support.wheels import ref; "
        "from envbuild.build.install import install, VenvTarget; "
        "ws=[Path(p) for p in sys.argv[2:]]; "
        "install([(ref(w), w) for w in ws], VenvTarget(python_version='3.11'), Path(sys.argv[1]))"
    )
    other = tmp_path / "elsewhere"
    other.mkdir()
    env = {**os.environ, "TZ": "Asia/Tokyo", "HOME": str(other)}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1]), *sys.path])
    subprocess.run(
        ["sh", "-c", 'umask 077 && exec "$@"', "sh", sys.executable, "-c", code, str(second)]
        + [str(w) for w in wheels.values()],
        check=True,
        cwd=other,
        env=env,
    )
    assert tree(first) == tree(second)
    modes = {mode & 0o777 for mode, _ in tree(second).values()}
    assert modes <= {0o755, 0o644, 0o777}


def test_write_venv_names_the_image_interpreter(tmp_path: Path) -> None:
    write_venv(tmp_path, TARGET)
    cfg = (tmp_path / "opt/venv/pyvenv.cfg").read_text()
    assert "home = /usr/bin\n" in cfg
    assert "include-system-site-packages = false\n" in cfg
    assert os.readlink(tmp_path / "opt/venv/bin/python") == "/usr/bin/python3"
    assert (tmp_path / SITE).is_dir()


def test_the_venv_runs_with_a_real_interpreter(tmp_path: Path, wheels: dict[str, Path]) -> None:
    """Point the venv at this host's Python and run the console script as the image would."""
    root = tmp_path / "img"
    venv = str(tmp_path / "img-venv")
    target = VenvTarget(
        venv=venv,
        interpreter=sys.executable,
        python_version=f"{sys.version_info[0]}.{sys.version_info[1]}",
    )
    write_venv(root, target)
    install([(ref(w), w) for w in wheels.values()], target, tmp_path / "layer")
    os.symlink(root / target.rel, venv)
    subprocess.run(["cp", "-a", f"{tmp_path / 'layer' / target.rel}/.", venv + "/"], check=True)
    out = subprocess.run([f"{venv}/bin/hello"], capture_output=True, text=True, check=True)
    assert out.stdout == "hello\n"


def test_overlaps_are_found_from_records_before_installing(tmp_path: Path) -> None:
    d = tmp_path / "w"
    a = make_wheel(
        d, "cuda-bindings", "13.5.0", {"cuda/bindings.py": "A\n", "cuda/__init__.py": ""}
    )
    b = make_wheel(d, "cuda-python", "12.6.2", {"cuda/bindings.py": "B\n", "cuda/__init__.py": ""})
    files = {"cuda-bindings": wheel_files(a, TARGET), "cuda-python": wheel_files(b, TARGET)}
    overlaps = find_overlaps(files)
    # the identical empty __init__.py is not a conflict; the differing module is
    assert [(o.first, o.second, o.paths) for o in overlaps] == [
        ("cuda-bindings", "cuda-python", ("lib/python3.11/site-packages/cuda/bindings.py",))
    ]
    with pytest.raises(OverlapError) as err:
        resolve_overlaps(overlaps, {})
    assert "cuda-bindings and cuda-python" in err.value.message
    assert "cuda/bindings.py" in "\n".join(err.value.lines())
    resolved, remove = resolve_overlaps(overlaps, {"cuda-python": "cuda-bindings"})
    assert resolved[0].winner == "cuda-bindings"
    assert remove == {"cuda-python": frozenset({"lib/python3.11/site-packages/cuda/bindings.py"})}
    # the loser's layer leaves the path out, and its RECORD no longer claims it
    root = tmp_path / "loser"
    install([(ref(b), b)], TARGET, root, remove=remove)
    assert not (root / SITE / "cuda/bindings.py").exists()
    assert (root / SITE / "cuda/__init__.py").exists()
    record = (root / SITE / "cuda_python-12.6.2.dist-info/RECORD").read_text()
    assert "cuda/bindings.py" not in record


def test_console_scripts_of_two_distributions_overlap(tmp_path: Path) -> None:
    d = tmp_path / "w"
    a = make_wheel(d, "one", "1", {"one.py": "def main(): pass\n"}, scripts={"tool": "one:main"})
    b = make_wheel(d, "two", "1", {"two.py": "def main(): pass\n"}, scripts={"tool": "two:main"})
    overlaps = find_overlaps({"one": wheel_files(a, TARGET), "two": wheel_files(b, TARGET)})
    assert [o.paths for o in overlaps] == [("bin/tool",)]
