"""Recording what a write made durable: the order of fsync and replace calls."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def record_syncs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Patch os.fsync and os.replace to record, in order, what each one was called on."""
    events: list[tuple[str, str]] = []
    fsync, replace = os.fsync, os.replace

    def recording_fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def recording_replace(src: str | Path, dst: str | Path) -> None:
        events.append(("replace", str(dst)))
        replace(src, dst)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "replace", recording_replace)
    return events
