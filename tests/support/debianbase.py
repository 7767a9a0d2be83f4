"""What the build and base tests share: skipping on a missing tool (never in CI), and the
session's small Debian base (made by the ``debian_rootfs`` fixture in tests/build/conftest.py)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import pytest

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


#: The smallest spec with a Debian base: what `lock` hands mmdebstrap (tests of its children
#: and of a full disk)
DEBIAN_SPEC = """\
name = "s"
[base]
kind = "debian"
suite = "bookworm"
packages = ["python3-minimal"]
[python]
version = "3.11"
[resolution]
exclude_newer = 2026-01-01T00:00:00Z
"""
