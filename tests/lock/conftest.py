"""Fixtures for the lock tests: a local package index (built once per session with uv and
served on 127.0.0.1) and a repository holding the demo spec pointed at it."""

from __future__ import annotations

import shutil
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import pyindex

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
