"""The remote cache seen through a stage: a source build made on one machine is fetched, not
compiled, on another (the cache itself: tests/store/test_remote.py)."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest
from support.registry import Registry
from support.sdists import FIXTURES, pack_sdist

from envbuild.registry.api import Endpoint
from envbuild.registry.ref import parse_repo
from envbuild.store.remote import CachedStore, RemoteCache

pytestmark = pytest.mark.registry


def cache_for(reg: Registry, repo: str) -> RemoteCache:
    return RemoteCache(parse_repo(reg.ref(repo)), endpoint=Endpoint(insecure=True))


def test_the_source_build_stage_uses_the_cache(registry: Registry, tmp_path: Path) -> None:
    """F's C-extension fixture through envbuild.sourcebuild.realize.realize: machine B gets the
    wheel
    machine A compiled, with its build log and audit, without compiling."""
    from envbuild.fsio import sha256_file
    from envbuild.sourcebuild.builder import HostBuilder
    from envbuild.sourcebuild.realize import realize
    from envbuild.sourcebuild.requests import FileRef, SourceBuildRequest

    sdist = pack_sdist(FIXTURES / "cext", "fixture-cext", "1.0.0", tmp_path)
    req = SourceBuildRequest.model_validate(
        {
            "dist": "fixture-cext",
            "version": "1.0.0",
            "sdist": FileRef(
                name=sdist.name, url=sdist.as_uri(), sha256=sha256_file(sdist),
                size=sdist.stat().st_size,
            ).model_dump(),
            "env": {"CEXT_GREETING": "cached"},
        }
    )  # fmt: skip
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    machine_a = CachedStore(tmp_path / "a", cache_for(registry, "cache/sourcebuild"))
    first = realize(req, HostBuilder(python), machine_a)
    assert not first.reused
    assert machine_a.remote.stats.published == [first.key]

    machine_b = CachedStore(tmp_path / "b", cache_for(registry, "cache/sourcebuild"))
    second = realize(req, HostBuilder(python), machine_b)
    assert second.reused and second.key == first.key
    assert machine_b.remote.stats.hits == [first.key]
    assert machine_b.remote.stats.published == []
    assert second.wheel_digest == first.wheel_digest and second.wheel == first.wheel
    assert second.audit == first.audit
    wheel = machine_b.blob_path(second.wheel_digest)
    with zipfile.ZipFile(wheel) as zf:
        assert any(n.startswith("fixture_cext/") and n.endswith(".so") for n in zf.namelist())
