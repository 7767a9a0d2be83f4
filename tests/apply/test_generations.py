"""Switching ``current``: a symlink renamed over the old one, then the state folder synced (with
fsio's fsync_dir, the same as every other rename)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.fsevents import record_syncs

from envbuild.apply import generations as gens
from envbuild.apply.paths import Paths


def test_set_current_syncs_the_state_folder_after_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = Paths(tmp_path, "/var/lib/envbuild/hf")
    paths.generations.mkdir(parents=True)
    gen = gens.Generation(3, paths.generations / "3-abc", None)  # type: ignore[arg-type]
    gen.path.mkdir()
    events = record_syncs(monkeypatch)
    gens.set_current(paths, gen)
    assert os.readlink(paths.current) == "generations/3-abc"
    assert events == [("replace", str(paths.current)), ("fsync", str(paths.state))]

    events.clear()
    gens.set_current(paths, None)
    assert not paths.current.is_symlink()
    assert events == [("fsync", str(paths.state))]
