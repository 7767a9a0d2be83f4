"""Fixtures for source builds: sdists packed from tests/cases/fixtures-src, a store, nvcc."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.sdists import FIXTURES, pack_sdist

from envbuild.fsio import sha256_file
from envbuild.lock.model import (
    EnvbuildLock,
    Hashes,
    Index,
    Lock,
    LockedBuild,
    LockedFile,
    LockedPackage,
    ToolTable,
)
from envbuild.sourcebuild.requests import FileRef, SourceBuildRequest
from envbuild.sourcebuild.toolchain import find_nvcc
from envbuild.spec.load import LoadedSpec
from envbuild.store.core import Store

_CEXT_SPEC = """\
name = "cext-demo"
[base]
kind = "debian"
[python]
version = "{python}"
[resolution]
exclude_newer = 2026-01-01T00:00:00Z
[builds.fixture-cext]
version = "1.0.0"
{extra}"""


def write_cext_spec(repo: Path, python: str = "3.11", extra: str = "") -> Path:
    """``specs/cext-demo.toml`` in ``repo``: a spec that source-builds the fixture-cext sdist
    (``extra``: more lines of its ``[builds.fixture-cext]``)."""
    spec = repo / "specs" / "cext-demo.toml"
    spec.write_text(_CEXT_SPEC.format(python=python, extra=extra))
    return spec


def cext_lock(
    loaded: LoadedSpec,
    sdist: FileRef,
    *,
    python: str = "3.11",
    requires_python: str | None = None,
    packages: Sequence[LockedPackage] = (),
    requirements: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> Lock:
    """A lock of the cext-demo spec (:func:`write_cext_spec`) whose one source build is
    ``sdist``, with ``packages`` locked beside it."""
    build = LockedBuild(
        name="fixture-cext",
        version="1.0.0",
        sdist=LockedFile(
            name=sdist.name,
            url=sdist.url,
            size=sdist.size or 0,
            hashes=Hashes(sha256=sdist.sha256),
        ),
        env=env or {},
    )
    return Lock(
        requires_python=requires_python or f">={python}",
        packages=list(packages),
        tool=ToolTable(
            envbuild=EnvbuildLock(
                spec="cext-demo",
                spec_hash=loaded.spec_hash(),
                python=python,
                platform="manylinux_2_36_x86_64",
                exclude_newer=datetime(2026, 1, 1, tzinfo=UTC),
                indexes=[Index(name="default", url="https://pypi.org/simple")],
                requirements=list(requirements),
                builds=[build],
            )
        ),
    )


@pytest.fixture(scope="session")
def sdists(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], FileRef]:
    """``sdists("cext")``: the fixture packed as an sdist, as a lock would name it."""
    where = tmp_path_factory.mktemp("sdists")
    names = {
        "cext": "fixture-cext",
        "cudaext": "fixture-cuda",
        "broken": "fixture-broken",
        "oomkill": "fixture-oomkill",
        "purepy": "fixture-pure",
    }
    made: dict[str, FileRef] = {}

    def get(folder: str) -> FileRef:
        if folder not in made:
            version = "2.1.0" if folder == "purepy" else "1.0.0"
            path = pack_sdist(FIXTURES / folder, names[folder], version, where)
            made[folder] = FileRef(
                name=path.name,
                url=path.as_uri(),
                sha256=sha256_file(path),
                size=path.stat().st_size,
            )
        return made[folder]

    return get


def request(sdist: FileRef, dist: str, **kw: object) -> SourceBuildRequest:
    return SourceBuildRequest.model_validate(
        {"dist": dist, "version": "1.0.0", "sdist": sdist.model_dump(), **kw}
    )


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "store")


def store_state(store: Store) -> tuple[list[str], list[str]]:
    """The blobs and derivation records in a store (what a failed build must not change)."""
    blobs = sorted(p.name for p in store.blobs.iterdir()) if store.blobs.is_dir() else []
    return blobs, store.derivations() if store.drvs.is_dir() else []


@pytest.fixture(scope="session")
def nvcc() -> str:
    """An nvcc: $ENVBUILD_NVCC, CUDA_HOME, PATH or /usr/local/cuda. CI installs NVIDIA's wheels
    (scripts/test) and sets ENVBUILD_NVCC; only outside CI may the CUDA tests skip."""
    found = find_nvcc(required=False)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("CI must provide nvcc (scripts/test installs nvidia-cuda-nvcc)")
        pytest.skip("no nvcc here: install nvidia-cuda-nvcc or set ENVBUILD_NVCC")
    return found


@pytest.fixture(scope="session")
def python_version() -> str:
    import sys

    return f"{sys.version_info.major}.{sys.version_info.minor}"


def have(tool: str) -> bool:
    return shutil.which(tool) is not None
