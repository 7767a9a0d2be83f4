"""Integrity of a real venv (pip and uv installs) against its RECORDs: edits, deletions,
additions and overlapping paths, in full and quick mode."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest

from envbuild.snapshot.model.pyenv import PythonEnv
from envbuild.snapshot.pyenv import Interpreter, scan_env, scan_site_packages
from snapshot.conftest import later, site_packages


def dist(env: PythonEnv, name: str):  # type: ignore[no-untyped-def]
    return next(d for d in env.distributions if d.name == name)


def test_a_fresh_venv_is_clean_and_knows_its_installers(venv: Path) -> None:
    env = scan_env(str(venv))
    assert env.implementation == "cpython"
    assert Path(env.prefix) == venv
    alpha, beta = dist(env, "alpha"), dist(env, "beta")
    assert (alpha.version, alpha.installer) == ("1.0", "pip")
    assert (beta.version, beta.installer) == ("1.0", "uv")
    for d in env.distributions:
        assert (d.modified, d.missing, d.unrecorded) == ([], [], []), d.name
    # beta was installed last: its bytes are on disk, and alpha is not blamed for them
    [overlap] = env.overlaps
    assert overlap.path == "shared/common.py"
    assert overlap.owners == ["alpha", "beta"]
    assert overlap.matches == ["beta"]


@pytest.mark.parametrize("mode", ["full", "quick"])
def test_a_debug_line_in_a_model_file_is_named_with_its_distribution(venv: Path, mode: str) -> None:
    model = site_packages(venv) / "alpha" / "models" / "llama.py"
    text = model.read_text()
    model.write_text(
        text.replace("    h = x * 2\n", "    h = x * 2\n    print('DEBUG', h.shape)\n")
    )
    later(model)
    env = scan_env(str(venv), mode)  # type: ignore[arg-type]
    [changed] = dist(env, "alpha").modified
    assert changed.path == "alpha/models/llama.py"
    assert changed.reason == "size"  # the size moved: both checks say so
    assert changed.actual_size == changed.expected_size + len("    print('DEBUG', h.shape)\n")
    assert changed.sha256 == hashlib.sha256(model.read_bytes()).hexdigest()
    assert changed.written_after_record is True
    assert dist(env, "beta").modified == []


def test_a_same_size_edit_is_caught_by_its_hash(venv: Path) -> None:
    model = site_packages(venv) / "alpha" / "models" / "llama.py"
    model.write_text(model.read_text().replace("x * 2", "x * 3"))
    later(model)
    for mode in ("full", "quick"):
        [changed] = dist(scan_env(str(venv), mode), "alpha").modified  # type: ignore[arg-type]
        assert (changed.path, changed.reason) == ("alpha/models/llama.py", "sha256")


def test_quick_mode_trusts_mtimes(venv: Path) -> None:
    """The documented limit of quick mode: an edit that restores the old mtime and size is not
    seen; the full check sees it."""
    model = site_packages(venv) / "alpha" / "models" / "llama.py"
    st = model.stat()
    model.write_text(model.read_text().replace("x * 2", "x * 3"))
    import os

    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert dist(scan_env(str(venv), "quick"), "alpha").modified == []
    assert [m.path for m in dist(scan_env(str(venv), "full"), "alpha").modified] == [
        "alpha/models/llama.py"
    ]


def test_deleted_and_added_files_are_named(venv: Path) -> None:
    sp = site_packages(venv)
    (sp / "alpha" / "models" / "llama.py").unlink()
    (sp / "alpha" / "models" / "debug_patch.py").write_text("HACK = True\n")
    (sp / "stray.py").write_text("")
    for mode in ("full", "quick"):
        env = scan_env(str(venv), mode)  # type: ignore[arg-type]
        alpha = dist(env, "alpha")
        assert alpha.missing == ["alpha/models/llama.py"]
        assert alpha.unrecorded == ["alpha/models/debug_patch.py"]
        assert env.unowned == ["stray.py"]


def test_bytecode_is_not_an_unrecorded_file(venv: Path) -> None:
    cache = site_packages(venv) / "alpha" / "__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "__init__.cpython-311.pyc").write_bytes(b"\x00" * 16)
    assert dist(scan_env(str(venv)), "alpha").unrecorded == []


def test_overwriting_a_shared_path_moves_the_blame(venv: Path) -> None:
    common = site_packages(venv) / "shared" / "common.py"
    common.write_text("OWNER = 'nobody'\n")
    env = scan_env(str(venv))
    [overlap] = env.overlaps
    assert overlap.matches == []
    # neither owner's bytes are there: both are told
    assert [m.path for m in dist(env, "alpha").modified] == ["shared/common.py"]
    assert [m.path for m in dist(env, "beta").modified] == ["shared/common.py"]


@pytest.mark.network
def test_packages_from_pypi_by_pip_and_uv(tmp_path: Path) -> None:
    """Real distributions from PyPI: pip's (with compiled bytecode in RECORD) and uv's."""
    import subprocess
    import sys

    from envbuild.proc import core as proc
    from snapshot.conftest import _env

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=_env())
    py = str(venv / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "-q", "six==1.16.0"], check=True, env=_env())
    subprocess.run(
        [proc.find_uv(), "pip", "install", "-q", "--python", py, "iniconfig==2.0.0"],
        check=True,
        env=_env(),
    )
    env = scan_env(str(venv))
    six, ini = dist(env, "six"), dist(env, "iniconfig")
    assert (six.version, six.installer, ini.version, ini.installer) == (
        "1.16.0",
        "pip",
        "2.0.0",
        "uv",
    )
    assert all(not d.modified and not d.missing and not d.unrecorded for d in env.distributions)
    target = site_packages(venv) / "six.py"
    target.write_text(target.read_text() + "\nprint('debug')\n")
    assert [m.path for m in dist(scan_env(str(venv)), "six").modified] == ["six.py"]


def test_every_record_style_is_read_alike(tmp_path: Path) -> None:
    """RECORDs are split without the csv module when they hold no quote or carriage return;
    quoted paths (a comma in the name) and CRLF line ends still go through csv. All three give
    the same entries, and a wrong sha256 is caught in each."""
    site = tmp_path / "site-packages"
    second = {"plain": "ab.py", "quoted": "a,b.py", "crlf": "a,b.py"}  # the "modified" file
    for name, other in second.items():
        end = "\r\n" if name == "crlf" else "\n"
        (site / name).mkdir(parents=True)
        info = site / f"{name}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        lines = []
        for rel, data in ((f"{name}/__init__.py", b"x = 1\n"), (f"{name}/{other}", b"y = 2\n")):
            (site / rel).write_bytes(data)
            b64 = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            lines.append(f'"{rel}"' if "," in rel else rel)
            lines[-1] += f",sha256={b64},{len(data)}"
        lines[1] = lines[1].replace("sha256=", "sha256=AAAA")
        lines += [f"{name}-1.0.dist-info/METADATA,,", f"{name}-1.0.dist-info/RECORD,,"]
        (info / "RECORD").write_bytes((end.join(lines) + end).encode())
    interp = Interpreter("py", "py", str(tmp_path), "3.11.0", "cpython", [str(site)])
    env = scan_site_packages(interp, "full")
    assert [d.name for d in env.distributions] == ["crlf", "plain", "quoted"]
    for d in env.distributions:
        assert (d.files, d.missing, d.unrecorded) == (4, [], []), d.name
        assert [(m.path, m.reason) for m in d.modified] == [
            (f"{d.name}/{second[d.name]}", "sha256")
        ]
