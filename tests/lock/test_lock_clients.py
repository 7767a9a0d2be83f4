"""The locks as other tools read them: PEP 751's file name, `packaging.pylock` validation of
every committed lock, and uv and pip installing a lock into a throwaway venv (a client that
rejects the file fails the test)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.pylock import Pylock, is_valid_pylock_path
from packaging.version import Version

from envbuild.lock.core import find_lock, legacy_lock_path, lock_path
from envbuild.spec import load_spec

REPO = Path(__file__).resolve().parents[2]
SEED_LOCKS = sorted((REPO / "lockfiles").glob("*.toml"))
CASE_LOCKS = sorted((REPO / "tests" / "cases").rglob("pylock*.toml"))


def _uv() -> str:
    from uv import find_uv_bin

    return find_uv_bin()


def _run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, **kw)  # type: ignore[call-overload]


def _demo_lock(cli, demo) -> Path:
    # Only the wheels: the demo's source build (flashy) and patched alpha are envbuild's own
    # business, a plain installer would build the sdist with a backend it fetches.
    spec = demo(('[builds.flashy]\nversion = "1.0.0"\n', ""), ('MAX_JOBS = "2"\n', ""),
                ('TORCH_CUDA_ARCH_LIST = "12.0"\n', ""), ("[builds.flashy.env]\n", ""),
                ('[patches]\nalpha = ["patches/alpha.patch"]\n', ""))  # fmt: skip
    result = cli("lock", "--python-only", spec)
    assert result.exit_code == 0, result.stderr
    return lock_path(load_spec(spec))


def test_there_are_seed_locks_and_case_locks():
    assert len(SEED_LOCKS) >= 5
    assert CASE_LOCKS


@pytest.mark.parametrize("path", SEED_LOCKS + CASE_LOCKS, ids=lambda p: p.name)
def test_every_committed_lock_has_a_pep751_name_and_validates(path: Path):
    assert is_valid_pylock_path(path), f"{path.name} is not a PEP 751 file name"
    lock = Pylock.from_dict(tomllib.loads(path.read_text(encoding="utf-8")))
    assert lock.packages


def test_lock_path_is_pep751_and_validates(cli, demo):
    path = _demo_lock(cli, demo)
    assert path.name == "pylock.demo.toml"
    assert is_valid_pylock_path(path)
    Pylock.from_dict(tomllib.loads(path.read_text(encoding="utf-8")))


def _venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    done = _run([_uv(), "venv", "--python", sys.executable, "--no-project", str(venv)])
    assert done.returncode == 0, done.stderr
    return venv


def _installed(venv: Path) -> dict[str, str]:
    done = _run([_uv(), "pip", "list", "--python", str(venv / "bin" / "python"), "--format",
                 "json"])  # fmt: skip
    assert done.returncode == 0, done.stderr
    import json

    return {d["name"]: d["version"] for d in json.loads(done.stdout)}


def _wheels(path: Path) -> dict[str, str]:
    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    return {p["name"]: p["version"] for p in raw["packages"]}


@pytest.mark.parametrize("how", ["install", "sync"])
def test_uv_installs_the_lock_as_it_is(cli, demo, tmp_path, how):
    path = _demo_lock(cli, demo)
    venv = _venv(tmp_path)
    argv = [_uv(), "pip", how, "--python", str(venv / "bin" / "python"), "--no-build"]
    done = _run([*argv, *(["-r"] if how == "install" else []), str(path)],
                env={**os.environ, "UV_NO_CONFIG": "1"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _installed(venv) == _wheels(path)


def test_pip_installs_the_lock_where_it_reads_pylock(cli, demo, tmp_path):
    import pip

    if Version(pip.__version__) < Version("26.1"):
        pytest.skip(f"pip {pip.__version__} reads pylock.toml files from 26.1 on (-r pylock.toml)")
    path = _demo_lock(cli, demo)
    venv = _venv(tmp_path)
    done = _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                 "install", "--no-deps", "--only-binary", ":all:", "-r", str(path)],
                env={**os.environ, "PIP_CONFIG_FILE": os.devnull})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _installed(venv) == _wheels(path)


def test_uv_refuses_the_old_name_which_is_why_it_moved(cli, demo, tmp_path):
    path = _demo_lock(cli, demo)
    old = path.with_name("demo.pylock.toml")
    old.write_bytes(path.read_bytes())
    venv = _venv(tmp_path)
    done = _run([_uv(), "pip", "install", "--python", str(venv / "bin" / "python"), "-r",
                 str(old)])  # fmt: skip
    assert done.returncode != 0
    assert not is_valid_pylock_path(old)


def test_the_old_name_is_read_for_one_release_with_the_rename_command(cli, demo, caplog):
    path = _demo_lock(cli, demo)
    loaded = load_spec(path.parent.parent / "specs" / "demo.toml")
    old = legacy_lock_path(loaded)
    path.rename(old)
    assert find_lock(loaded) == old
    check = cli("lock", "--check", loaded.path)
    assert check.exit_code == 0, check.stdout + check.stderr
    root = path.parent.parent
    hint = f"git -C {root} mv lockfiles/demo.pylock.toml lockfiles/pylock.demo.toml"
    assert hint in check.stderr  # runs from wherever the user is (the test is not in root)
    # locking again writes the new name and says the old one is now dead weight
    again = cli("lock", "--python-only", loaded.path)
    assert again.exit_code == 0, again.stderr
    assert path.read_bytes() == old.read_bytes()
    assert find_lock(loaded) == path
    assert "demo.pylock.toml is the lock's old name" in again.stderr
