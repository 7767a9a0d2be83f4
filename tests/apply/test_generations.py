"""Switching ``current``: a symlink renamed over the old one, then the state folder synced (with
fsio's fsync_dir, the same as every other rename)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from envbuild.apply import generations as gens
from envbuild.apply.paths import Paths


def test_set_current_syncs_the_state_folder_after_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = Paths(tmp_path, "/var/lib/envbuild/hf")
    paths.generations.mkdir(parents=True)
    gen = gens.Generation(3, paths.generations / "3-abc", None)  # type: ignore[arg-type]
    gen.path.mkdir()
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
    gens.set_current(paths, gen)
    assert os.readlink(paths.current) == "generations/3-abc"
    assert events == [("replace", str(paths.current)), ("fsync", str(paths.state))]

    events.clear()
    gens.set_current(paths, None)
    assert not paths.current.is_symlink()
    assert events == [("fsync", str(paths.state))]
