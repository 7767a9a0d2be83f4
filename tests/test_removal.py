"""No removal crosses a mount: what a killed build left is swept without touching what is
mounted in it (issue 24: the host's /dev/shm, bound into mmdebstrap's chroot, was emptied and
made 0700 by the next run's sweep). Real mounts: these tests run as root (here and in CI)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import CliResult
from support.mounts import Mounts, mounted_under, mounts  # noqa: F401

from envbuild import fsio, scratch

OLD = 10 * scratch.STALE_AFTER


def _host_folder(path: Path) -> dict[str, bytes]:
    """A stand-in for the host's /dev/shm: files, a folder, mode 1777."""
    (path / "sub").mkdir(parents=True)
    files = {"sem.held": b"in use\n", "sub/pulse-shm": b"x" * 4096}
    for name, data in files.items():
        (path / name).write_bytes(data)
    path.chmod(0o1777)
    return files


def _left_by_a_killed_build(folder: Path) -> None:
    """Old enough for the sweep, and locked by no one (its process is gone)."""
    os.utime(folder, (os.stat(folder).st_atime - OLD, os.stat(folder).st_mtime - OLD))


def _untouched(path: Path, files: dict[str, bytes]) -> None:
    assert stat.S_IMODE(path.stat().st_mode) == 0o1777
    assert {n: (path / n).read_bytes() for n in files} == files


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """The scratch parent (ENVBUILD_SCRATCH, where in-memory folders go) and the store."""
    parent = tmp_path / "scratch"
    parent.mkdir()
    monkeypatch.setenv(scratch.ENV, str(parent))
    return parent, tmp_path / "store"


@pytest.mark.parametrize("where", ["memory", "store"])
def test_the_next_run_detaches_a_killed_chroots_mounts_and_leaves_what_they_showed(
    where: str,
    tmp_path: Path,
    places: tuple[Path, Path],
    mounts: Mounts,  # noqa: F811
    cli: Callable[..., CliResult],
) -> None:
    parent, store = places
    host_shm = tmp_path / "host-shm"
    files = _host_folder(host_shm)
    if where == "memory":  # mmdebstrap's TMPDIR in memory: envbuild-chroot-*
        left = parent / f"{scratch.PREFIX}{scratch.CHROOT}k1ll3d"
    else:  # no room in memory: the store's scratch space
        assert cli("gc", "--store", store).exit_code == 0  # makes the store
        left = store / "tmp" / f"{scratch.CHROOT}k1ll3d"
    chroot = left / "mmdebstrap.XXXXXXXXXX"
    for sub in ("dev/shm", "proc", "etc"):
        (chroot / sub).mkdir(parents=True)
    (chroot / "etc" / "hostname").write_text("localhost\n")
    mounts.bind(host_shm, chroot / "dev" / "shm")  # as mmdebstrap binds the host's /dev/shm
    mounts.tmpfs(chroot / "proc")
    (chroot / "proc" / "on-the-tmpfs").write_text("x")
    _left_by_a_killed_build(left)

    got = cli("gc", "--store", store)  # what a next run does with what a killed one left

    _untouched(host_shm, files)
    assert got.exit_code == 0, got.stderr
    assert not left.exists()
    assert mounted_under(tmp_path) == []  # detached, not left hanging


def test_a_mount_in_a_folder_that_is_no_chroot_is_refused_and_left_as_it_is(
    tmp_path: Path,
    places: tuple[Path, Path],
    mounts: Mounts,  # noqa: F811
    cli: Callable[..., CliResult],
) -> None:
    parent, store = places
    host = tmp_path / "host"
    files = _host_folder(host)
    left = parent / f"{scratch.PREFIX}stage-k1ll3d"  # a layer's staging tree: no chroot runs there
    (left / "venv" / "lib").mkdir(parents=True)
    (left / "venv" / "kept").write_text("x")
    mounts.bind(host, left / "venv" / "lib")
    _left_by_a_killed_build(left)

    got = cli("gc", "--store", store)

    _untouched(host, files)
    assert got.exit_code == 3
    point = os.path.realpath(left / "venv" / "lib")
    assert f"mounted at {point}" in got.stderr and f"umount {point}" in got.stderr
    assert mounted_under(left) == [point]
    assert (left / "venv" / "kept").read_text() == "x"  # nothing removed, not even beside it
    _untouched(host, files)


def test_a_removal_refuses_a_device_it_did_not_make_even_unseen_in_mountinfo(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mounts: Mounts,  # noqa: F811
) -> None:
    tree = tmp_path / "tree"
    (tree / "a" / "other").mkdir(parents=True)
    (tree / "a" / "mine").write_text("x")
    mounts.tmpfs(tree / "a" / "other")
    (tree / "a" / "other" / "theirs").write_text("kept")
    (tree / "a" / "other").chmod(0o755)
    empty = tmp_path / "mountinfo"
    empty.write_text("")
    monkeypatch.setattr(fsio, "MOUNTINFO", empty)  # the walk's own device check is what stops it
    from envbuild.errors import RemovalRefused

    with pytest.raises(RemovalRefused, match=r"another file system is at .*/a/other"):
        fsio.rmtree(tree, unmount=True)

    assert (tree / "a" / "other" / "theirs").read_text() == "kept"
    assert stat.S_IMODE((tree / "a" / "other").stat().st_mode) == 0o755
