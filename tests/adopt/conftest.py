"""Fixtures for the adopt tests: hand-built venvs made with the real uv, from a local PEP 691
index (:mod:`support.pyindex`) or from PyPI, edited by hand afterwards."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest

# the rehearsal root with fake GPUs and systemd, the fake vLLM's index and the local HF hub
from apply.conftest import hub, machine, wheel_index  # noqa: F401
from support import pyindex

from envbuild.proc import core as proc

UPLOADED = datetime(2025, 3, 1, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ENVBUILD_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("UV_PYTHON_DOWNLOADS", "never")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))


def uv(*args: str | Path, cache: Path | None = None) -> None:
    extra = {"UV_CACHE_DIR": str(cache)} if cache else {}
    env = proc.child_env({"UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never", **extra})
    for key in ("UV_CACHE_DIR",):
        if key in os.environ and key not in extra:
            env[key] = os.environ[key]
    done = subprocess.run(
        [proc.find_uv(), *map(str, args)], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def make_venv(path: Path, *requirements: str, find_links: Path | None = None) -> Path:
    """``uv venv`` and ``uv pip install`` (offline from ``find_links`` when given). Files are
    copied, not hard-linked from uv's cache: the tests edit them by hand, and an edit in place
    of a link would edit the cache (every later install of that wheel got the edit)."""
    uv("venv", "-q", "--python", "3.11", path)
    if requirements:
        where = ["--no-index", "--find-links", str(find_links)] if find_links else []
        py = path / "bin" / "python"
        uv("pip", "install", "-q", "--link-mode=copy", "--python", py, *where, *requirements)
    return path


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3.*/site-packages"))


@contextmanager
def served(files: list[Path], root: Path) -> Iterator[str]:
    """A local index holding ``files``; yields its simple URL."""
    pyindex.write_index(root, [(f, "simple", UPLOADED) for f in files])
    with pyindex.serve(root) as url:
        yield f"{url}/simple"


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` (links as their target) by relative path -> sha256."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            out[path.relative_to(root).as_posix()] = "-> " + os.readlink(path)
        elif path.is_file():
            out[path.relative_to(root).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


Repo = Callable[[], Path]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """An empty project repository (a folder with .git) to adopt into."""
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    return root
