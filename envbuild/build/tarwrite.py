"""The deterministic tar writer: arranged layer entries as one tar stream into a
:class:`Sink`.

The tar is the same bytes for the same content on every machine: GNU format (long names as
``././@LongLink`` records, no PAX headers, no atime/ctime), every mtime the one given
(``SOURCE_DATE_EPOCH`` or 0), empty user and group names, two zero blocks and zeros to a whole
10 KiB record at the end. Headers are built directly (``tarfile`` only for numbers past their
octal fields); file contents are read straight into the sink's 1 MiB buffer, and a file that
changes size while it is read is refused. The entries come from :mod:`envbuild.build.entries`;
what is done with the stream (hashing, compressing, storing) is :mod:`envbuild.build.layers`'.
"""

from __future__ import annotations

import logging
import os
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from envbuild.build.entries import Entry, Kind
from envbuild.errors import InputFileError, LayerError

log = logging.getLogger(__name__)

CHUNK = 1 << 20
BLOCK = 512
RECORD = 20 * BLOCK


class Sink:
    """Collects writes into a 1 MiB buffer handed to ``out`` when full (``out`` must not keep
    the view it gets). File contents are read straight into the buffer (:meth:`read_exact`)."""

    def __init__(self, out: Callable[[bytes | bytearray | memoryview], None]) -> None:
        self.out = out
        self.buf = bytearray(CHUNK)
        self.view = memoryview(self.buf)
        self.fill = 0
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Append ``data`` to the stream."""
        n = len(data)
        fill = self.fill
        if fill + n <= CHUNK:
            self.view[fill : fill + n] = data
            self.fill = fill + n
            self.size += n
            return
        view = memoryview(data).cast("B")
        while view:
            if self.fill == CHUNK:
                self.flush()
            k = min(CHUNK - self.fill, len(view))
            self.view[self.fill : self.fill + k] = view[:k]
            self.fill += k
            self.size += k
            view = view[k:]

    def read_exact(self, fd: int, size: int) -> bool:
        """Append the ``size`` bytes of the file ``fd`` to the stream; False when the file turns
        out longer or shorter. Each read asks for one byte more than is left, so a short read
        (the end of a regular file) proves the size without another call."""
        left = size
        while True:
            if self.fill == CHUNK:
                self.flush()
            fill = self.fill
            want = min(left + 1, CHUNK - fill)
            got = os.readv(fd, [self.view[fill : fill + want]])
            if got > left:
                return False  # longer; its extra byte is overwritten by what comes next
            self.fill = fill + got
            self.size += got
            left -= got
            if got < want and (not got or not left):
                return not left  # the file's end: all of it, or it got shorter

    def read_from(self, fd: int, n: int) -> int:
        """Read up to ``n`` bytes of ``fd`` into the stream; returns how many came (0: EOF)."""
        if self.fill == CHUNK:
            self.flush()
        got = os.readv(fd, [self.view[self.fill : self.fill + min(n, CHUNK - self.fill)]])
        self.fill += got
        self.size += got
        return got

    def flush(self) -> None:
        """Hand what the buffer holds to ``out``."""
        if self.fill:
            self.out(self.view[: self.fill])
            self.fill = 0


@dataclass
class TarCounts:
    """What one tar stream held: entries, files among them, and the files' bytes."""

    entries: int = 0
    files: int = 0
    file_bytes: int = 0


_TYPES = {
    Kind.FILE: tarfile.REGTYPE,
    Kind.DIR: tarfile.DIRTYPE,
    Kind.SYMLINK: tarfile.SYMTYPE,
    Kind.HARDLINK: tarfile.LNKTYPE,
}
_MAX_OCTAL_11 = 8**11
_MAX_OCTAL_7 = 8**7
_ZEROS = bytes(100)
_TAIL = tarfile.GNU_MAGIC + bytes(512 - 265)  # magic "ustar  \0"; empty user/group names
_TAIL_SUM = sum(_TAIL) + 8 * ord(" ")  # the checksum field counts as eight spaces


def _short_header(
    name: bytes, mode: int, uid: int, gid: int, size: int, mtime: int, typeflag: bytes, link: bytes
) -> bytes:
    """A GNU tar header block for a name and link of at most 100 bytes and numbers that fit
    their octal fields (the caller checks): what ``tarfile`` writes, built in one join."""
    nums = b"%07o\0%07o\0%07o\0%011o\0%011o\0" % (mode, uid, gid, size, mtime)
    chksum = sum(name) + sum(nums) + typeflag[0] + sum(link) + _TAIL_SUM
    return b"".join(
        (name, _ZEROS[len(name) :], nums, b"%06o\0 " % chksum, typeflag, link,
         _ZEROS[len(link) :], _TAIL)
    )  # fmt: skip


def _gnu_header(
    name: bytes, mode: int, uid: int, gid: int, size: int, mtime: int, typeflag: bytes, link: bytes
) -> bytes:
    """The GNU tar header of one entry whose numbers fit their octal fields (the caller
    checks): a ``././@LongLink`` record first for a link or name over 100 bytes, as
    ``tarfile`` writes it (its own mode, ids and mtime 0, the name NUL-terminated)."""
    if len(name) <= 100 and len(link) <= 100:
        return _short_header(name, mode, uid, gid, size, mtime, typeflag, link)
    parts = []
    for value, kind in ((link, tarfile.GNUTYPE_LONGLINK), (name, tarfile.GNUTYPE_LONGNAME)):
        if len(value) > 100:
            n = len(value) + 1
            parts.append(_short_header(b"././@LongLink", 0, 0, 0, n, 0, kind, b""))
            parts.append(value + bytes(BLOCK - len(value) % BLOCK))  # NUL, then to the block
    parts.append(_short_header(name[:100], mode, uid, gid, size, mtime, typeflag, link[:100]))
    return b"".join(parts)


def header(entry: Entry, mtime: int) -> bytes:
    """The tar header block(s) of ``entry``: exactly what ``tarfile`` writes in GNU format,
    built directly unless a number needs GNU's base-256 form (a file of 8 GiB or more)
    because packing a layer of 50,000 files through ``TarInfo.tobuf`` costs seconds."""
    name = entry.path + "/" if entry.kind is Kind.DIR else entry.path
    size = entry.size if entry.kind is Kind.FILE else 0
    if (
        size >= _MAX_OCTAL_11
        or not 0 <= mtime < _MAX_OCTAL_11
        or not 0 <= entry.uid < _MAX_OCTAL_7
        or not 0 <= entry.gid < _MAX_OCTAL_7
    ):
        info = tarfile.TarInfo(name)
        info.mtime, info.mode = mtime, entry.mode & 0o7777
        info.uid, info.gid, info.uname, info.gname = entry.uid, entry.gid, "", ""
        info.type, info.linkname, info.size = _TYPES[entry.kind], entry.linkname, size
        return info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")
    return _gnu_header(
        name.encode("utf-8", "surrogateescape"),
        entry.mode & 0o7777,
        entry.uid,
        entry.gid,
        size,
        mtime,
        _TYPES[entry.kind],
        entry.linkname.encode("utf-8", "surrogateescape"),
    )


def _end(sink: Sink) -> None:
    """Two zero blocks, then zeros up to a whole 10 KiB record (as tar writes)."""
    end = 2 * BLOCK
    sink.write(bytes(end + (-(sink.size + end)) % RECORD))
    sink.flush()


def write_tar(
    entries: list[Entry],
    sink: Sink,
    mtime: int,
    progress: Callable[[int], None] | None = None,
) -> TarCounts:
    """Write the arranged ``entries`` as one tar stream into ``sink``."""
    counts = TarCounts()
    for entry in entries:
        sink.write(header(entry, mtime))
        counts.entries += 1
        if entry.kind is not Kind.FILE:
            continue
        counts.files += 1
        counts.file_bytes += entry.size
        if entry.size:
            _copy_content(entry, sink)
            if entry.size % BLOCK:
                sink.write(_PAD[entry.size % BLOCK])
            if progress is not None:
                progress(entry.size)
    _end(sink)
    return counts


_PAD = [bytes(BLOCK - n) for n in range(BLOCK)]  # _PAD[size % 512]: zeros to the block's end


def _changed(path: str) -> InputFileError:
    return InputFileError(
        path, "changed size while it was being packed", hint="do not modify the tree during a build"
    )


def _copy_file(path: str | bytes, size: int, sink: Sink) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise InputFileError(os.fsdecode(path), f"cannot read: {exc.strerror}") from exc
    try:
        exact = sink.read_exact(fd, size)
    finally:
        os.close(fd)
    if not exact:
        raise _changed(os.fsdecode(path))


def _copy_content(entry: Entry, sink: Sink) -> None:
    if entry.source is None:
        raise LayerError(f"{entry.path!r} has {entry.size} bytes but no source")
    if isinstance(entry.source, Path):
        _copy_file(str(entry.source), entry.size, sink)
        return
    left = entry.size
    with entry.source() as f:
        while left:
            data = f.read(min(left, CHUNK))
            if not data:
                break
            sink.write(data)
            left -= len(data)
        if left or f.read(1):
            raise _changed(entry.path)
