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
