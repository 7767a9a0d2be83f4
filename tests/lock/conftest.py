"""Fixtures for the lock tests: a local package index (built once per session with uv and
served on 127.0.0.1), a repository holding the demo spec pointed at it, and (for the slow tests)
a repository whose Debian base `envbuild lock` pinned with mmdebstrap once per session."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import pyindex
from support.mmdebstrap import builds_in, mmdebstrap_shim

CASES = Path(__file__).resolve().parent.parent / "cases" / "lock"


@dataclass(frozen=True)
class LocalIndex:
    url: str  # base URL; the indexes are <url>/simple and <url>/torch
    root: Path  # the served folder: files/ and one folder per index

    @property
    def simple(self) -> str:
        return f"{self.url}/simple"

    @property
    def torch(self) -> str:
        return f"{self.url}/torch"


@pytest.fixture(scope="session")
def uv_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("uv-cache")


@pytest.fixture(scope="session")
def local_index(tmp_path_factory: pytest.TempPathFactory, uv_cache: Path) -> Iterator[LocalIndex]:
    config = tomllib.loads((CASES / "index.toml").read_text())
    defaults = config["defaults"]
    work = tmp_path_factory.mktemp("pyindex")
    built = pyindex.build_projects(CASES / "projects", work / "dist", uv_cache)
    served = []
    for project, files in built.items():
        settings = {**defaults, **config.get("projects", {}).get(project, {})}
        for path in files:
            if "retag" in settings:
                if not path.name.endswith(".whl"):
                    continue
                path = pyindex.retag_wheel(path, settings["retag"])
            served.append((path, settings["index"], settings["upload-time"]))
    root = work / "root"
    pyindex.write_index(root, served)
    with pyindex.serve(root) as url:
        yield LocalIndex(url, root)


@pytest.fixture(autouse=True)
def _uv_isolated(monkeypatch: pytest.MonkeyPatch, uv_cache: Path, tmp_path: Path) -> None:
    """uv uses the session's cache, and no user or system configuration can reach it."""
    monkeypatch.setenv("UV_CACHE_DIR", str(uv_cache))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))


SpecWriter = Callable[..., Path]


@pytest.fixture
def demo(repo: Path, local_index: LocalIndex) -> SpecWriter:
    """Write the demo spec into ``repo`` (``specs/demo.toml``, with its patch), after replacing
    each ``old -> new`` pair given; returns the spec's path. Call again to edit it."""

    def write(*replacements: tuple[str, str], name: str = "demo") -> Path:
        text = (CASES / "specs" / "demo.toml").read_text().replace("@INDEX@", local_index.url)
        for old, new in replacements:
            assert old in text, f"{old!r} is not in the demo spec"
            text = text.replace(old, new)
        patches = repo / "specs" / "patches"
        if not patches.exists():
            shutil.copytree(CASES / "specs" / "patches", patches)
        path = repo / "specs" / f"{name}.toml"
        path.write_text(text)
        return path

    return write


@dataclass(frozen=True)
class PinnedRepo:
    repo: Path  # specs/pinned.toml with its lock; copy it (pinned_repo) before changing anything
    store: Path  # holds the rootfs of the pinned set, kept by the resolving mmdebstrap run
    lock: bytes  # lockfiles/pylock.pinned.toml as `envbuild lock` wrote it
    mmdebstrap_builds: list[str]  # the mmdebstrap runs of that lock

    @property
    def lock_file(self) -> Path:
        return self.repo / "lockfiles" / "pylock.pinned.toml"


@pytest.fixture(scope="session")
def pinned_session(
    tmp_path_factory: pytest.TempPathFactory, local_index: LocalIndex, uv_cache: Path
) -> PinnedRepo:
    """`envbuild lock specs/pinned.toml` run once per session, as a user would: it resolves the
    Debian base (bookworm essential + python3-minimal) with the real mmdebstrap against the
    Debian mirror (about 15 s) and the Python side against the local index."""
    work = tmp_path_factory.mktemp("pinned")
    repo = work / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "specs").mkdir()
    text = (CASES / "specs" / "pinned.toml").read_text().replace("@INDEX@", local_index.url)
    (repo / "specs" / "pinned.toml").write_text(text)
    shim, record = mmdebstrap_shim(work / "shim")
    store = work / "store"
    env = {
        **os.environ,
        "PATH": f"{shim}{os.pathsep}{os.environ.get('PATH', '')}",
        "UV_CACHE_DIR": str(uv_cache),
        "XDG_CONFIG_HOME": str(work / "xdg-config"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "envbuild", "lock", "specs/pinned.toml", "--store", str(store)],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"envbuild lock failed ({done.returncode}):\n{done.stderr}", pytrace=False)
    lock = (repo / "lockfiles" / "pylock.pinned.toml").read_bytes()
    return PinnedRepo(repo, store, lock, builds_in(record))


@pytest.fixture
def pinned_repo(pinned_session: PinnedRepo, tmp_path: Path) -> Path:
    """A private copy of the session's pinned repository; returns its spec's path."""
    copy = tmp_path / "pinned-repo"
    shutil.copytree(pinned_session.repo, copy, symlinks=True)
    return copy / "specs" / "pinned.toml"
