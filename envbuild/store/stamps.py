"""Stat stamps: which store blobs need no re-hash because nothing changed since they were hashed.

A blob is trusted only while its bytes hash to its name, and re-hashing gigabytes at every build
would make a no-op build slow. So, like git's index, the store keeps each blob's stat (size,
mtime, ctime, inode, device: :func:`file_stamp`) from when its bytes were last hashed, in
``<store>/stamps/<hex>``, and hashes again only a blob whose stat changed since (a write through
a hard link, a ``chmod``, a copy put in its place). ctime cannot be set back by a user, so a write
followed by ``touch -d`` still shows. What no stat shows (a bit flipped on the disk itself) is
found only by hashing everything (:mod:`envbuild.store.verify`).

A stamp is a cache: a lost or stale one costs one re-hash, never a wrong answer, so stamps are
written without fsync and dropped freely.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import stat
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

CHUNK = 1 << 20


class NotRegular(FileNotFoundError):
    """A blob's name is taken by something that is not a regular file (a folder, a fifo, a
    symlink, a device): no blob is there."""


def open_regular(path: Path) -> IO[bytes]:
    """The blob file ``path`` opened for reading. Never a symlink's target (``O_NOFOLLOW``),
    never blocking on a fifo (``O_NONBLOCK``; the type is checked by ``lstat`` before the open
    and by ``fstat`` after it): anything but a regular file is :class:`NotRegular`, as a
    missing one is FileNotFoundError."""
    if not stat.S_ISREG(path.lstat().st_mode):
        raise NotRegular(errno.ENOENT, "not a regular file", str(path))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # it became a symlink since the lstat
            raise NotRegular(errno.ENOENT, "not a regular file", str(path)) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegular(errno.ENOENT, "not a regular file", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def file_stamp(st: os.stat_result) -> str:
    """What changes whenever a file's bytes may have: size, mtime, ctime, inode, device (git's
    index keeps the same). ctime cannot be set back by a user, so a write followed by
    ``touch -d`` still shows."""
    return f"{st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {st.st_ino} {st.st_dev}"


def _same_but_ctime(a: str, b: str) -> bool:
    x, y = a.split(), b.split()
    return len(x) == len(y) == 5 and x[:2] == y[:2] and x[3:] == y[3:]


class Stamps:
    """The stamps of one store's blobs (``folder``: ``<store>/stamps``), with a memo of what
    this process has hashed or read already, so that no stamp file is read twice."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._checked: dict[str, str] = {}

    def record(self, hexd: str, path: Path) -> None:
        """Note that ``path``'s bytes were hashed just now and match ``hexd`` (best effort)."""
        try:
            stamp = file_stamp(path.lstat())
            tmp = self.folder / f".{hexd}.{os.getpid()}.{threading.get_native_id()}"
            tmp.write_text(stamp)
            os.replace(tmp, self.folder / hexd)
        except OSError as exc:
            log.debug("cannot record the stamp of %s: %s", hexd[:12], exc)
            return
        self._checked[hexd] = stamp

    def check(self, hexd: str, path: Path) -> bool:
        """Whether the blob at ``path`` exists and its bytes hash to ``hexd``: cheap when its
        stat is its stamp, otherwise hashed again now (and stamped when right)."""
        try:
            st = path.lstat()
        except FileNotFoundError:
            return False
        if not stat.S_ISREG(st.st_mode):
            return False  # a folder, a fifo or a symlink is no blob (and is never opened)
        now = file_stamp(st)
        if self._checked.get(hexd) == now:
            return True
        try:
            if (self.folder / hexd).read_text() == now:
                self._checked[hexd] = now
                return True
        except (OSError, UnicodeDecodeError):
            pass
        log.debug("blob %s changed since it was hashed: hashing it again", hexd[:12])
        try:
            ok = self.hash(path) == hexd
        except FileNotFoundError:
            return False
        if ok:
            self.record(hexd, path)
        else:
            self._checked.pop(hexd, None)
        return ok

    def hash(self, path: Path) -> str:
        """The sha256 (hex) of the blob file at ``path``, read now (:func:`open_regular`)."""
        h = hashlib.sha256()
        with open_regular(path) as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
        return h.hexdigest()

    def linked(self, hexd: str, path: Path) -> None:
        """A new hard link to the blob changed its ctime alone: take the new stat as its stamp,
        when this process checked the blob before and nothing else changed."""
        try:
            now = file_stamp(path.lstat())
        except OSError:
            return
        before = self._checked.get(hexd)
        if before is not None and before != now and _same_but_ctime(before, now):
            self.record(hexd, path)

    def forget(self, hexd: str) -> None:
        """Drop the stamp of a blob that is being removed."""
        self._checked.pop(hexd, None)
        (self.folder / hexd).unlink(missing_ok=True)

    def stale(self, kept: Iterable[str]) -> list[Path]:
        """The stamp files of blobs not among ``kept`` (hex digests), leftovers included."""
        keep = set(kept)
        return [p for p in self.folder.iterdir() if p.name not in keep]
