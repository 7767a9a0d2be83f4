"""Scratch folders in memory: where they go, when they do not, and that they are removed."""

from __future__ import annotations

from pathlib import Path

import pytest

from envbuild import scratch
from envbuild.errors import UsageError


@pytest.fixture
def shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for /dev/shm with a known amount of room."""
    monkeypatch.delenv(scratch.ENV, raising=False)
    folder = tmp_path / "shm"
    folder.mkdir()
    monkeypatch.setattr(scratch, "SHM", folder)
    monkeypatch.setattr(scratch, "RESERVE", 0)
    monkeypatch.setattr(scratch, "_room", lambda parent: 100 if parent == folder else 0)
    return folder


def test_a_folder_goes_to_shm_when_it_fits_and_is_removed(shm: Path) -> None:
    with scratch.folder("stage-", 60) as got:
        assert got is not None and got.parent == shm and got.name.startswith("envbuild-stage-")
        (got / "file").write_text("x")
    assert list(shm.iterdir()) == []


def test_folders_held_at_once_count_against_the_room(shm: Path) -> None:
    with scratch.folder("a-", 60) as first:
        assert first is not None
        with scratch.folder("b-", 60) as second:
            assert second is None  # 60 + 60 > 100: the caller uses the store
        with scratch.folder("c-", 40) as third:
            assert third is not None
    with scratch.folder("d-", 100) as again:  # all given back
        assert again is not None


def test_no_usable_shm_means_none(shm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scratch, "SHM", shm / "absent")
    with scratch.folder("stage-", 1) as got:
        assert got is None


def test_the_real_room_check_measures_a_folder_and_gives_nothing_for_a_missing_one(
    tmp_path: Path,
) -> None:
    assert scratch._room(tmp_path / "absent") == 0
    room = scratch._room(tmp_path)  # a plain writable folder: its free space, capped by memory
    assert 0 < room <= scratch._mem_available()


def test_the_setting_picks_the_folder_or_the_store(
    tmp_path: Path, shm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chosen = tmp_path / "chosen"
    chosen.mkdir()
    monkeypatch.setenv(scratch.ENV, str(chosen))
    with scratch.folder("stage-", 1 << 60) as got:  # a chosen folder is not measured
        assert got is not None and got.parent == chosen
    monkeypatch.setenv(scratch.ENV, "store")
    with scratch.folder("stage-", 1) as got:
        assert got is None
    monkeypatch.setenv(scratch.ENV, str(tmp_path / "no" / "such"))
    with pytest.raises(UsageError, match=scratch.ENV), scratch.folder("stage-", 1):
        pass


def test_a_killed_builds_folder_is_swept_a_live_one_is_not(shm: Path) -> None:
    import fcntl
    import os

    old = 10 * scratch.STALE_AFTER
    stale, live, fresh, other = (
        shm / n for n in ("envbuild-stage-a", "envbuild-stage-b", "envbuild-c", "theirs")
    )
    for d in (stale, live, fresh, other):
        (d / "sub").mkdir(parents=True)
        (d / "sub" / "f").write_text("x")
    for d in (stale, live, other):
        os.utime(d, (os.stat(d).st_atime - old, os.stat(d).st_mtime - old))
    holder = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(holder, fcntl.LOCK_EX)  # as a running build holds its folder
    try:
        with scratch.folder("stage-", 1) as got:
            assert got is not None
            # the folder in use is locked against another process's sweep
            probe = os.open(got, os.O_RDONLY | os.O_DIRECTORY)
            with pytest.raises(BlockingIOError):
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.close(probe)
        assert not stale.exists()
        assert live.exists() and fresh.exists() and other.exists()
    finally:
        os.close(holder)
