"""Scratch folders in memory (a tmpfs) when there is room for them.

A build makes and deletes tens of thousands of files it never keeps: a layer's staging tree
(installed by uv, packed, removed) with uv's unzipped wheels, and mmdebstrap's chroot. On a
disk file system each new file costs an inode allocation, and on a file system that has seen
many deletions ext4's allocator is what the profile shows: a cold cpu-stack build on the 2-core
development machine took 42.3 s with 35 CPU-seconds in the kernel, and 33.1 s with 14 when those
trees were on /dev/shm. Where a tree is made cannot show in a layer's bytes (the tar is sorted
and normalized; bench/build.py prints the same digest either way).

:func:`folder` gives a fresh folder on ``ENVBUILD_SCRATCH`` (a folder, no questions asked; or
``store``: never in memory), else on /dev/shm when it is a tmpfs that runs programs and device
nodes (a chroot needs both) and both it and the machine's available memory have room for the
estimated size plus :data:`RESERVE`, counting what other folders hold right now; else nowhere
(None) and the caller uses its own folder in the store. A folder is locked (``flock``) while it
is used, so one that a killed build left behind is recognised and removed by the next call.

:func:`temp_dir` is the same for every other temporary folder envbuild makes (uv's requirements
and wheel links, a wheel being patched, a downloaded sdist, ...; :data:`TEMP_KINDS`): locked
while used, and what a killed run left removed by the next run of the same kind. ``envbuild gc``
calls :func:`sweep` to remove all of them at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from envbuild.errors import UsageError
from envbuild.fsio import NO_SPACE, no_space, rmtree

log = logging.getLogger(__name__)

ENV = "ENVBUILD_SCRATCH"
PREFIX = "envbuild-"
#: The kind of folder mmdebstrap's chroot is made in (its TMPDIR): in memory ``envbuild-chroot-*``,
#: in the store's scratch space ``chroot-*``. A chroot's mounts (the host's /dev, /dev/shm,
#: /proc, /sys bound in) are what a killed mmdebstrap leaves: removing such a folder detaches
#: them first (:func:`envbuild.fsio.rmtree`'s ``unmount``); any other folder with a mount in it
#: is refused.
CHROOT = "chroot-"
#: A folder of this prefix older than this (seconds) and locked by no one was left by a build
#: that was killed: the next :func:`folder` on that parent removes it.
STALE_AFTER = 60.0
SHM = Path("/dev/shm")
#: Left free on the tmpfs and in available memory beyond every folder's estimate.
RESERVE = 2 << 30
_UNFIT = os.ST_NOEXEC | os.ST_NODEV | os.ST_RDONLY


class _Ledger:
    """What the folders handed out so far may take (two layers are staged at once)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reserved = 0

    def take(self, parent: Path, needed: int, *, check: bool) -> bool:
        with self.lock:
            if check and _room(parent) < self.reserved + needed + RESERVE:
                return False
            self.reserved += needed
            return True

    def give(self, needed: int) -> None:
        with self.lock:
            self.reserved -= needed


_ledger = _Ledger()


def _mem_available() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _room(parent: Path) -> int:
    """Bytes a folder on ``parent`` may take: its free space, at most the available memory (0:
    it cannot run a chroot, is read-only or not writable)."""
    try:
        fs = os.statvfs(parent)
    except OSError:
        return 0
    if fs.f_flag & _UNFIT or not os.access(parent, os.W_OK):
        return 0
    return min(fs.f_bavail * fs.f_frsize, _mem_available())


@contextlib.contextmanager
def folder(prefix: str, needed: int) -> Iterator[Path | None]:
    """A fresh folder for about ``needed`` bytes of scratch, removed after the block; None when
    there is no room in memory (or ``ENVBUILD_SCRATCH=store``)."""
    setting = os.environ.get(ENV, "")
    if setting == "store":
        yield None
        return
    parent = Path(setting) if setting else SHM
    _sweep(parent)
    if not _ledger.take(parent, needed, check=not setting):
        yield None
        return
    try:
        try:
            path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{prefix}", dir=parent))
            held = _hold(path)
        except OSError as exc:
            if not setting:  # /dev/shm went away or filled up since: the store's folder then
                yield None
                return
            raise UsageError(
                f"{ENV}={setting}: cannot make a folder there: {exc.strerror or exc}",
                hint=f"point {ENV} at a writable folder, set it to `store`, or unset it",
            ) from exc
        try:
            yield path
        finally:
            try:
                rmtree(path, unmount=prefix == CHROOT)
            finally:
                os.close(held)
    finally:
        _ledger.give(needed)


def _hold(path: Path) -> int:
    """Lock the fresh folder for as long as it is used (a process that dies lets go of it);
    if it cannot be locked it is removed again."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        rmtree(path)
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        os.close(fd)
        rmtree(path)
        raise
    return fd


#: The folders :func:`temp_dir` makes, ``envbuild-<kind>*``, and where: in the system's temporary
#: directory (None) or in a fixed folder. Only these are swept there: other programs' folders
#: are not ours to judge.
TEMP_KINDS: dict[str, str | None] = {
    "wheels-": None,  # uv's requirements and wheel links (install.py)
    "lock-": None,  # uv pip compile's project (lock/resolve.py)
    "sdist-": None,  # an sdist downloaded for its PKG-INFO (lock/sdist.py)
    "wheel-": None,  # a wheel downloaded for its METADATA (sourceplan.py)
    "patch-": None,  # a wheel unpacked to be patched (patches.py)
    "audit-": None,  # a library unpacked from a wheel for cuobjdump (audit.py)
    "auth-": None,  # a registry auth.json with credentials (registry/auth.py)
    "copy-": None,  # skopeo's digest file (registry/transport.py)
    "engine-": None,  # docker save / load archives (registry/engine.py)
    "ca-": "/tmp",  # the CA bundle for mmdebstrap: one path inside its chroot too (base/debian.py)
}


def _kind_root(kind: str) -> Path:
    fixed = TEMP_KINDS[kind]
    return Path(fixed) if fixed else system_temp()


def system_temp() -> Path:
    """The system's temporary folder ($TMPDIR, else /tmp, /var/tmp …: tempfile's choice, which
    writes a small file to each to try it). None usable (a full disk) raises
    :class:`~envbuild.errors.NoSpace` naming the first and its room, not tempfile's bare
    FileNotFoundError."""
    try:
        return Path(tempfile.gettempdir())
    except FileNotFoundError as exc:
        wanted = os.environ.get("TMPDIR") or "/tmp"
        raise no_space(
            wanted,
            doing="making a temporary folder; /tmp, /var/tmp and the current folder have no "
            "room either",
            hint="free space there, or set TMPDIR to a folder with room",
        ) from exc


@contextlib.contextmanager
def temp_dir(kind: str) -> Iterator[Path]:
    """A fresh folder ``envbuild-<kind>*`` (a key of :data:`TEMP_KINDS`), locked while the block
    runs and removed after it; first the ones killed runs left are removed."""
    if kind not in TEMP_KINDS:
        raise ValueError(f"not a known temporary folder kind: {kind!r}")
    with _guarded(_kind_root(kind), f"{PREFIX}{kind}") as path:
        yield path


@contextlib.contextmanager
def beside(dest: Path, kind: str) -> Iterator[Path]:
    """A fresh folder ``.<dest's name>.<kind>*`` next to ``dest`` (on its file system, to be
    renamed into place), locked like :func:`temp_dir`'s; what a killed run left beside the same
    ``dest`` is removed by the next one (``gc`` cannot know where such folders are)."""
    with _guarded(dest.parent, f".{dest.name}.{kind}") as path:
        yield path


def guarded_folder(parent: Path, prefix: str) -> contextlib.AbstractContextManager[Path]:
    """A fresh folder ``<parent>/<prefix>*``, locked while the block runs and removed after it;
    first the ones killed runs left there with this prefix are removed (the store's scratch
    space uses this)."""
    return _guarded(parent, prefix)


def sweep_folders(parent: Path, prefixes: tuple[str, ...]) -> int:
    """Remove what killed runs left in ``parent`` under ``prefixes`` (folders older than
    :data:`STALE_AFTER` that no one holds locked). Returns how many."""
    return _sweep(parent, prefixes)


@contextlib.contextmanager
def _guarded(parent: Path, prefix: str) -> Iterator[Path]:
    _sweep(parent, (prefix,))
    try:
        path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    except OSError as exc:
        if exc.errno in NO_SPACE:
            raise no_space(parent, doing=f"making a folder {prefix}*") from exc
        raise
    held = _hold(path)
    try:
        yield path
    finally:
        try:
            rmtree(path, unmount=prefix.startswith(CHROOT))
        finally:
            os.close(held)


def sweep() -> int:
    """Remove what killed runs left: scratch folders in memory (or on ``ENVBUILD_SCRATCH``)
    and :func:`temp_dir` folders of every kind. Returns how many were removed."""
    setting = os.environ.get(ENV, "")
    removed = 0
    if setting != "store":
        removed += _sweep(Path(setting) if setting else SHM)
    by_root: dict[Path, list[str]] = {}
    for kind in TEMP_KINDS:
        by_root.setdefault(_kind_root(kind), []).append(f"{PREFIX}{kind}")
    for parent, prefixes in by_root.items():
        removed += _sweep(parent, tuple(prefixes))
    return removed


def _sweep(parent: Path, prefixes: tuple[str, ...] = (PREFIX,)) -> int:
    """Remove the folders of builds that were killed: named by this module, older than
    :data:`STALE_AFTER` (a folder just made is not locked yet) and locked by no one. In memory,
    what a killed build left would otherwise take RAM until the next reboot."""
    removed = 0
    try:
        entries = [e for e in os.scandir(parent) if e.name.startswith(prefixes)]
    except OSError:
        return 0
    now = time.time()
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            if now - entry.stat(follow_symlinks=False).st_mtime < STALE_AFTER:
                continue
            fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: a build is using it
            os.close(fd)
            continue
        log.info("removing %s, left by a build that did not finish", entry.path)
        try:
            chroot = entry.name.startswith((PREFIX + CHROOT, CHROOT))  # in memory, in the store
            rmtree(Path(entry.path), unmount=chroot)
        finally:
            os.close(fd)
        removed += 1
    return removed
