"""mmdebstrap for tests: the real one, behind a shim that records each call."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def need_mmdebstrap() -> str:
    """The real mmdebstrap; skips without it, except in CI, where a missing tool fails."""
    found = shutil.which("mmdebstrap")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("mmdebstrap is not installed; CI must have it", pytrace=False)
        pytest.skip("mmdebstrap is not installed (apt-get install mmdebstrap)")
    return found


def mmdebstrap_shim(folder: Path) -> tuple[Path, Path]:
    """A folder to put first on PATH whose ``mmdebstrap`` records its arguments, one line per
    call, then runs the real one. Returns the folder and the record."""
    real = need_mmdebstrap()
    folder.mkdir(parents=True, exist_ok=True)
    record = folder / "calls.txt"
    record.touch()
    shim = folder / "mmdebstrap"
    shim.write_text(f'#!/bin/sh\necho "$*" >> "{record}"\nexec "{real}" "$@"\n')
    shim.chmod(0o755)
    return folder, record


def builds_in(record: Path) -> list[str]:
    """The recorded mmdebstrap calls that build a rootfs (not ``--version``)."""
    return [line for line in record.read_text().splitlines() if line != "--version"]
