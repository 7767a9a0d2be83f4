"""Layers: deterministic tar streams, compressed and hashed on the fly, written into the store.

Public API (stable; E and H build on it)::

    layer = layer_from_tree(store, staging_dir, prefix="opt/venv")    # -> Layer
    layer = write_layer(store, entries, compression=Compression.ZSTD)  # entries: Iterable[Entry]
    entries = tree_entries(root, prefix="opt/venv")                   # sorted, normalized
    whiteout("opt/venv/old.py"), opaque("opt/venv/lib")              # deletions from lower layers
    compressor_id(Compression.ZSTD)   # "zstd 1.5.4 -3": put it in a layer's derivation inputs
    with open_uncompressed(store.blob_path(layer.digest), layer.media_type) as f: ...

A :class:`Layer` carries ``digest`` (of the compressed blob, its name in the store), ``diff_id``
(sha256 of the uncompressed tar), ``size``, ``media_type`` and a summary (entries, files, bytes).

The tar is the same bytes for the same content on every machine: entries sorted bytewise by path
(a directory before its contents), GNU format (long names as ``././@LongLink`` records, no PAX
headers, no atime/ctime), every mtime ``SOURCE_DATE_EPOCH`` (or 0), empty user and group names,
missing parent directories added (0755). :func:`tree_entries` also sets uid/gid 0 and modes 0755
(directories, executables) or 0644, whatever the umask; hardlinked files stay hardlinks, the first
path in sort order holding the content; device files, fifos and sockets are refused.
The stream goes tar -> sha256 (diff_id) -> compressor (``zstd -T0`` or ``pigz``, through 1 MiB
buffers) -> sha256 (digest) -> a temp file in the store renamed to its digest: never in memory.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import logging
import os
import queue
import stat
import tarfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import IO

from pydantic import BaseModel, ConfigDict

from envbuild import proc
from envbuild.errors import InputFileError, UserError
from envbuild.store.core import Store

log = logging.getLogger("envbuild.build.layers")

CHUNK = 1 << 20
#: 1 MiB buffers circulating between the tar writer and the thread hashing and feeding them on.
BUFFERS = 4
BLOCK = 512
RECORD = 20 * BLOCK
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


class Compression(StrEnum):
    ZSTD = "zstd"
    GZIP = "gzip"
    NONE = "none"


MEDIA_TYPES = {
    Compression.ZSTD: "application/vnd.oci.image.layer.v1.tar+zstd",
    Compression.GZIP: "application/vnd.oci.image.layer.v1.tar+gzip",
    Compression.NONE: "application/vnd.oci.image.layer.v1.tar",
}
DEFAULT_LEVEL = {Compression.ZSTD: 3, Compression.GZIP: 6, Compression.NONE: 0}


class Kind(StrEnum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"
    HARDLINK = "hardlink"


class LayerError(UserError):
    """A layer's content cannot be written as asked (a bad path, a device file, a duplicate)."""


Opener = Callable[[], IO[bytes]]


@dataclass(frozen=True)
class Entry:
    """One member of a layer. ``path`` is relative and POSIX (``opt/venv/bin/python``).

    A file's bytes come from ``source`` (a path, or a function opening a stream) and must be
    ``size`` long. A hardlink's ``linkname`` is the layer path of the file it shares content with.
    """

    path: str
    kind: Kind
    mode: int = 0o644
    uid: int = 0
    gid: int = 0
    size: int = 0
    linkname: str = ""
    source: Path | Opener | None = None


def whiteout(path: str) -> Entry:
    """An entry deleting ``path`` of a lower layer."""
    p = PurePosixPath(normalize_path(path))
    return Entry(str(p.parent / f"{WHITEOUT}{p.name}").removeprefix("./"), Kind.FILE, 0o644)


def opaque(directory: str) -> Entry:
    """An entry hiding everything a lower layer had under ``directory``."""
    return Entry(f"{normalize_path(directory)}/{OPAQUE}", Kind.FILE, 0o644)


class Layer(BaseModel):
    """A layer blob in the store, with what an image config and manifest need to name it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    digest: str
    diff_id: str
    size: int
    media_type: str
    compression: Compression
    compressor: str
    uncompressed_size: int
    entries: int
    files: int
    file_bytes: int


def source_date_epoch() -> int:
    """``$SOURCE_DATE_EPOCH`` when set (the reproducible-builds convention), else 0."""
    value = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if not value:
        return 0
    if not value.isdigit():
        raise UserError(
            f"SOURCE_DATE_EPOCH={value!r} is not a number of seconds",
            hint="set it to an integer such as $(git log -1 --format=%ct), or unset it",
        )
    return int(value)


def normalize_path(path: str) -> str:
    """``./a//b/`` -> ``a/b``; refuses absolute paths, ``..`` and empty names."""
    if path.startswith("/"):
        raise LayerError(f"layer path {path!r} is absolute", hint="paths are relative to /")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise LayerError(f"layer path {path!r} contains '..'")
    if not parts:
        return ""
    return "/".join(parts)


@functools.cache
def _tool_version(tool: str) -> str:
    done = proc.run([tool, "--version"], tool=tool, hint=_install_hint(tool))
    for word in (done.stdout + done.stderr).replace(",", " ").split():
        if word[:1] in "v0123456789" and any(c.isdigit() for c in word):
            return word.lstrip("v")
    return "unknown"


def _install_hint(tool: str) -> str:
    return f"install it (Debian: apt-get install {tool})"


def compressor_id(compression: Compression, level: int | None = None) -> str:
    """Names the compressor and its version: another version may give other bytes, so put this
    into the derivation inputs of a layer."""
    if compression is Compression.NONE:
        return "none"
    level = DEFAULT_LEVEL[compression] if level is None else level
    tool = "zstd" if compression is Compression.ZSTD else "pigz"
    return f"{tool} {_tool_version(tool)} -{level}"


def _compress_argv(compression: Compression, level: int) -> list[str]:
    if compression is Compression.ZSTD:
        return ["zstd", f"-{level}", "-T0", "-q", "-c", "--no-progress"]
    # -n: no name and no time in the gzip header; pigz output does not depend on its thread count
    return ["pigz", f"-{level}", "-n", "-c"]


def tree_entries(root: Path, *, prefix: str = "") -> list[Entry]:
    """The entries of the tree at ``root``, placed under ``prefix`` in the layer, sorted and
    normalized: uid/gid 0; directories 0755; files 0755 when any exec bit is set, else 0644;
    symlinks as they are; hardlinked files as hardlinks. Refuses device files, fifos, sockets."""
    root = Path(root)
    base = normalize_path(prefix)
    found: list[tuple[bytes, Entry, tuple[int, int] | None]] = []

    def walk(directory: Path, rel: str) -> None:
        try:
            with os.scandir(directory) as it:
                children = list(it)
        except OSError as exc:
            raise InputFileError(directory, f"cannot read the directory: {exc.strerror}") from exc
        for child in children:
            path = f"{rel}/{child.name}" if rel else child.name
            if child.is_dir(follow_symlinks=False):  # d_type: no stat needed
                found.append((os.fsencode(path), Entry(path, Kind.DIR, 0o755), None))
                walk(directory / child.name, path)
                continue
            if child.is_symlink():
                target = os.readlink(child.path)
                found.append(
                    (os.fsencode(path), Entry(path, Kind.SYMLINK, 0o777, linkname=target), None)
                )
                continue
            st = child.stat(follow_symlinks=False)
            mode = st.st_mode
            if stat.S_ISREG(mode):
                perm = 0o755 if mode & 0o111 else 0o644
                source = directory / child.name
                entry = Entry(path, Kind.FILE, perm, size=st.st_size, source=source)
                ident = (st.st_dev, st.st_ino) if st.st_nlink > 1 else None
                found.append((os.fsencode(path), entry, ident))
            else:
                raise LayerError(
                    f"{child.path} is a device file, fifo or socket; a layer holds only files, "
                    "directories and links",
                    hint="remove it from the tree before packing",
                )

    walk(root, base)
    found.sort(key=lambda t: t[0])
    first_of: dict[tuple[int, int], str] = {}
    entries: list[Entry] = []
    for _key, entry, ident in found:
        if ident is not None:
            if ident in first_of:
                entry = Entry(entry.path, Kind.HARDLINK, entry.mode, linkname=first_of[ident])
            else:
                first_of[ident] = entry.path
        entries.append(entry)
    return entries


def _fast_normal(path: str) -> bool:
    """True when ``path`` is already normal (the common case), so the full check is skipped."""
    return (
        bool(path)
        and path[0] not in "/."
        and "//" not in path
        and "/." not in path
        and not path.endswith("/")
    )


def arrange(entries: Iterable[Entry]) -> list[Entry]:
    """Normalize paths, refuse duplicates, add missing parents, sort bytewise, and make the
    first path of each hardlink group (in sort order) the one that holds the content."""
    by_path: dict[str, Entry] = {}
    hardlinks: list[str] = []
    for entry in entries:
        path = entry.path if _fast_normal(entry.path) else normalize_path(entry.path)
        if not path:
            continue  # the layer's root directory is the image's /, not an entry
        if entry.kind is Kind.HARDLINK:
            linkname = normalize_path(entry.linkname)
            if path != entry.path or linkname != entry.linkname:
                entry = replace(entry, path=path, linkname=linkname)
            hardlinks.append(path)
        elif path != entry.path:
            entry = replace(entry, path=path)
        known = by_path.get(path)
        if known is not None and known != entry:
            raise LayerError(f"the layer has two different entries for {path!r}")
        by_path[path] = entry
    for path in list(by_path):
        cut = path.rfind("/")
        while cut > 0:
            parent = path[:cut]
            known = by_path.get(parent)
            if known is None:
                by_path[parent] = Entry(parent, Kind.DIR, 0o755)
            elif known.kind is not Kind.DIR:
                raise LayerError(f"{path!r} is inside {parent!r}, which is not a directory")
            else:
                break  # its own parents were checked when it was added
            cut = parent.rfind("/")
    groups: dict[str, list[str]] = {}
    for path in hardlinks:
        entry = by_path[path]
        target, seen = entry.linkname, {path}
        while target in by_path and by_path[target].kind is Kind.HARDLINK:
            if target in seen:
                raise LayerError(f"hardlink loop at {path!r}")
            seen.add(target)
            target = by_path[target].linkname
        if target not in by_path or by_path[target].kind is not Kind.FILE:
            raise LayerError(f"hardlink {path!r} points at {entry.linkname!r}, not a file here")
        groups.setdefault(target, []).append(path)
    for target, links in groups.items():
        members = sorted([target, *links], key=os.fsencode)
        first, content = members[0], by_path[target]
        by_path[first] = replace(content, path=first)
        for other in members[1:]:
            by_path[other] = Entry(
                other, Kind.HARDLINK, content.mode, content.uid, content.gid, linkname=first
            )
    return [by_path[p] for p in sorted(by_path, key=os.fsencode)]


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
        if self.fill:
            self.out(self.view[: self.fill])
            self.fill = 0


class _HandoffSink(Sink):
    """A :class:`Sink` whose full buffers go to a thread that hashes them (the diff_id) and
    writes them on (to the compressor's pipe), while this thread fills the next one: sha256
    and the pipe's copy release the GIL, so they run beside the tar writer's Python. A few
    1 MiB buffers circulate; nothing else is held."""

    def __init__(self, out: Callable[[bytes | bytearray | memoryview], None], buffers: int) -> None:
        super().__init__(out)
        self.diff = hashlib.sha256()
        self.failures: list[BaseException] = []
        self._full: queue.SimpleQueue[tuple[bytearray, int] | None] = queue.SimpleQueue()
        self._free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        for _ in range(buffers - 1):
            self._free.put(bytearray(CHUNK))
        self._thread = threading.Thread(target=self._run, name="layer-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._full.get()) is not None:
            buf, n = item
            if not self.failures:
                try:
                    view = memoryview(buf)[:n]
                    self.diff.update(view)
                    self.out(view)
                except BaseException as exc:  # handed to the writing thread at its next flush
                    self.failures.append(exc)
            self._free.put(buf)

    def flush(self) -> None:
        if self.failures:
            raise self.failures[0]
        if self.fill:
            self._full.put((self.buf, self.fill))
            self.buf = self._free.get()
            self.view = memoryview(self.buf)
            self.fill = 0

    def abandon(self) -> None:
        """Stop the thread without writing what is queued (the layer failed anyway)."""
        self.failures.append(LayerError("the layer was abandoned"))
        self._full.put(None)
        self._thread.join()

    def close(self) -> None:
        """Wait for every buffer to be written; raises what went wrong in the thread."""
        self._full.put(None)
        self._thread.join()
        if self.failures:
            raise self.failures[0]


@contextlib.contextmanager
def _handoff(out: Callable[[bytes | bytearray | memoryview], None]) -> Iterator[_HandoffSink]:
    sink = _HandoffSink(out, BUFFERS)
    try:
        yield sink
        sink.flush()
    except BaseException:
        sink.abandon()
        raise
    sink.close()


@dataclass
class _Counts:
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
) -> _Counts:
    """Write the arranged ``entries`` as one tar stream into ``sink``."""
    counts = _Counts()
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


def _write_tree(
    root: Path,
    prefix: str,
    sink: Sink,
    mtime: int,
    progress: Callable[[int], None] | None,
) -> _Counts:
    """Write the tree at ``root`` under ``prefix`` as one tar stream, walking it in the final
    order: the same bytes as ``write_tar(arrange(tree_entries(root, prefix=prefix)))``, but
    no list of entries is built and the stream starts at once. Within a directory, a
    subdirectory's contents sort as its name plus ``/`` (so ``a.txt`` comes between ``a``
    and ``a/x``), which is the bytewise order of the full paths."""
    counts = _Counts()
    short = 0 <= mtime < _MAX_OCTAL_11
    first_of: dict[tuple[int, int], bytes] = {}

    def emit(path: bytes, kind: Kind, mode: int, size: int = 0, link: bytes = b"") -> None:
        name = path + b"/" if kind is Kind.DIR else path
        if short and len(name) <= 100 and len(link) <= 100 and size < _MAX_OCTAL_11:
            sink.write(_short_header(name, mode, 0, 0, size, mtime, _TYPES[kind], link))
        elif short and size < _MAX_OCTAL_11:
            sink.write(_gnu_header(name, mode, 0, 0, size, mtime, _TYPES[kind], link))
        else:
            entry = Entry(os.fsdecode(path), kind, mode, size=size, linkname=os.fsdecode(link))
            sink.write(header(entry, mtime))
        counts.entries += 1

    def listing(directory: bytes) -> Iterator[tuple[bytes, int, os.DirEntry[bytes]]]:
        try:
            with os.scandir(directory) as it:
                children = list(it)
        except OSError as exc:
            raise InputFileError(
                os.fsdecode(directory), f"cannot read the directory: {exc.strerror}"
            ) from exc
        keyed: list[tuple[bytes, int, os.DirEntry[bytes]]] = []
        for child in children:
            if child.is_dir(follow_symlinks=False):  # d_type: no stat needed
                keyed.append((child.name, _DIR, child))
                keyed.append((child.name + b"/", _DESCEND, child))
            else:
                keyed.append((child.name, _OTHER, child))
        keyed.sort(key=_first)
        return iter(keyed)

    top = list(listing(os.fsencode(root)))
    rel = b""
    for part in prefix.split("/") if prefix and top else ():  # an empty tree adds no parents
        rel += os.fsencode(part)
        emit(rel, Kind.DIR, 0o755)
        rel += b"/"
    stack = [(iter(top), rel)]
    while stack:
        children, rel = stack[-1]
        for _key, what, child in children:
            path = rel + child.name
            if what == _DESCEND:
                stack.append((listing(child.path), path + b"/"))
                break
            if what == _DIR:
                emit(path, Kind.DIR, 0o755)
                continue
            if child.is_symlink():
                emit(path, Kind.SYMLINK, 0o777, link=os.readlink(child.path))
                continue
            st = child.stat(follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                raise LayerError(
                    f"{os.fsdecode(child.path)} is a device file, fifo or socket; a layer holds "
                    "only files, directories and links",
                    hint="remove it from the tree before packing",
                )
            mode = 0o755 if st.st_mode & 0o111 else 0o644
            if st.st_nlink > 1:
                ident = (st.st_dev, st.st_ino)
                first = first_of.get(ident)
                if first is not None:
                    emit(path, Kind.HARDLINK, mode, link=first)
                    continue
                first_of[ident] = path
            size = st.st_size
            emit(path, Kind.FILE, mode, size)
            counts.files += 1
            if size:
                counts.file_bytes += size
                _copy_file(child.path, size, sink)
                if size % BLOCK:
                    sink.write(_PAD[size % BLOCK])
                if progress is not None:
                    progress(size)
        else:
            stack.pop()
    _end(sink)
    return counts


_DIR, _DESCEND, _OTHER = 0, 1, 2


def _first(item: tuple[bytes, int, object]) -> bytes:
    return item[0]


def _write(
    store: Store,
    compression: Compression,
    level: int,
    produce: Callable[[Sink], _Counts],
) -> Layer:
    """Run ``produce`` (which writes one tar stream into a sink) into a new layer blob."""
    with store.blob_writer() as blob:
        if compression is Compression.NONE:
            with _handoff(blob.write) as sink:
                counts = produce(sink)
        else:
            argv = _compress_argv(compression, level)
            with (
                proc.filter_bytes(argv, blob.write, hint=_install_hint(argv[0])) as feed,
                _handoff(feed) as sink,
            ):
                counts = produce(sink)
    layer = Layer(
        digest=blob.digest,
        diff_id=f"sha256:{sink.diff.hexdigest()}",
        size=blob.size,
        media_type=MEDIA_TYPES[compression],
        compression=compression,
        compressor=compressor_id(compression, level),
        uncompressed_size=sink.size,
        entries=counts.entries,
        files=counts.files,
        file_bytes=counts.file_bytes,
    )
    log.debug(
        "layer %s: %d entries, %d bytes -> %d",
        layer.digest[:19],
        counts.entries,
        sink.size,
        blob.size,
    )
    return layer


def write_layer(
    store: Store,
    entries: Iterable[Entry],
    *,
    compression: Compression = Compression.ZSTD,
    level: int | None = None,
    mtime: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> Layer:
    """Write ``entries`` as one deterministic layer blob into ``store`` and describe it.
    ``progress`` is called with the byte count of each file packed."""
    arranged = arrange(entries)
    level = DEFAULT_LEVEL[compression] if level is None else level
    when = source_date_epoch() if mtime is None else mtime
    return _write(store, compression, level, lambda s: write_tar(arranged, s, when, progress))


def layer_from_tree(
    store: Store,
    root: Path,
    *,
    prefix: str = "",
    compression: Compression = Compression.ZSTD,
    level: int | None = None,
    mtime: int | None = None,
    extra: Iterable[Entry] = (),
    progress: Callable[[int], None] | None = None,
) -> Layer:
    """Pack the tree at ``root`` (placed under ``prefix``), plus ``extra`` entries (whiteouts).
    Without ``extra`` the tree is written as it is walked (no list of entries first)."""
    extra = list(extra)
    if extra:
        entries = [*tree_entries(root, prefix=prefix), *extra]
        return write_layer(
            store, entries, compression=compression, level=level, mtime=mtime, progress=progress
        )
    base = normalize_path(prefix)
    level = DEFAULT_LEVEL[compression] if level is None else level
    when = source_date_epoch() if mtime is None else mtime
    return _write(
        store, compression, level, lambda s: _write_tree(Path(root), base, s, when, progress)
    )


def compression_of(media_type: str) -> Compression:
    """The compression a layer media type (OCI or Docker) names."""
    if media_type.endswith(("+zstd", ".zstd")):
        return Compression.ZSTD
    if media_type.endswith(("+gzip", ".gzip")):
        return Compression.GZIP
    if media_type.endswith((".tar", "layer.v1.tar")):
        return Compression.NONE
    raise UserError(f"unsupported layer media type {media_type!r}")


@contextlib.contextmanager
def open_uncompressed(path: Path, media_type: str) -> Iterator[IO[bytes]]:
    """The uncompressed tar stream of a layer blob, read sequentially."""
    compression = compression_of(media_type)
    if compression is Compression.ZSTD:
        argv = ["zstd", "-d", "-c", "-q", "--no-progress", str(path)]
        with proc.reading(argv, tool="zstd", hint=_install_hint("zstd")) as f:
            yield f
    elif compression is Compression.GZIP:
        with gzip.open(path, "rb") as g:
            yield g  # type: ignore[misc]
    else:
        with path.open("rb") as f:
            yield f
