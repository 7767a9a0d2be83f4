"""Fixtures for the image tests: a session-wide store holding a small mmdebstrap Debian base."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import pytest

from envbuild.build.base import debian
from envbuild.build.base.model import BaseImage
from envbuild.lock.model import DebianBaseLock
from envbuild.spec.model import DebianBase
from envbuild.store.core import Store


def need(tool: str, package: str | None = None) -> None:
    """Skip when ``tool`` is missing, except in CI, where a missing tool fails the run."""
    if shutil.which(tool) is None:
        if os.environ.get("CI"):
            pytest.fail(f"{tool} is not installed; CI must have it", pytrace=False)
        pytest.skip(f"{tool} is not installed (apt-get install {package or tool})")


@dataclass(frozen=True)
class DebianRootfs:
    store: Store
    spec: DebianBase
    lock: DebianBaseLock
    base: BaseImage


@pytest.fixture(scope="session")
def debian_rootfs(tmp_path_factory: pytest.TempPathFactory) -> DebianRootfs:
    """bookworm's essential set plus python3-minimal, resolved and built once per session
    (mmdebstrap, about 20 s)."""
    need("mmdebstrap")
    store = Store(tmp_path_factory.mktemp("debian-store"))
    spec = DebianBase(kind="debian", suite="bookworm", packages=["python3-minimal"])
    lock = debian.resolve(store, spec)
    base = debian.build(store, spec, lock)
    return DebianRootfs(store, spec, lock, base)
