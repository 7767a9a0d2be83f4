"""Fixtures for the build tests: the build index, and a session-wide store holding a small
mmdebstrap Debian base (``debian_rootfs``) for the image and base tests."""

from __future__ import annotations

import pytest
from support.buildindex import build_index  # noqa: F401
from support.debianbase import DebianRootfs, need

from envbuild.build.base import debian
from envbuild.spec.model import DebianBase
from envbuild.store.core import Store


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
