"""Reading the tar streams of a base: guarded tar headers, bounded and checked decompression,
and the three readers, each member checked by :class:`envbuild.build.base.tarsafe.Tree`.

* :func:`tar_entries` turns a seekable tarball into layer entries (a rootfs, re-packed);
* :func:`scan` reads an image layer through (kept as it is);
* :func:`safe_extract` unpacks a layer into a folder (applying whiteouts), creating files with
  ``O_NOFOLLOW | O_EXCL``;
* :func:`open_stream` decompresses gzip, xz, zstd or bzip2 within the tree's limits, and turns a
  truncated or corrupt stream into a :class:`~envbuild.build.base.tarsafe.CorruptArchive`.
"""

from __future__ import annotations

import bz2
import contextlib
import functools
import gzip
import io
import lzma
import mmap
import os
import posixpath
import shutil
import stat
import tarfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol, cast

from envbuild.build.base.filekind import NOT_TAR_HINT, describe
from envbuild.build.base.tarsafe import SPARSE_HINT, CorruptArchive, Tree, is_device, member_path
from envbuild.build.entries import OPAQUE, WHITEOUT, Entry, Kind, Opener
from envbuild.build.layers import Compression
from envbuild.errors import ToolFailed, UnsafeArchive
from envbuild.fsio import rmtree
from envbuild.oci.compression import MEDIA_TYPES, open_uncompressed

CHUNK = 1 << 20
#: The largest PAX or GNU long-name header read (tarfile holds one in memory).
MAX_HEADER = 1 << 20


class _Refused(Exception):
    """Raised inside tarfile's header parsing; turned into a located error by the reader."""

    def __init__(self, message: str, *, corrupt: bool = False, first: bool = False) -> None:
        super().__init__(message)
        self.corrupt = corrupt
        self.first = first  # at the first header of the stream


_tar: Any = tarfile  # its header errors and _proc_member are not in the stubs
_LONG = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
_PAX = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)


class _Header(tarfile.TarInfo):
    """tarfile's member, refusing sparse members and oversized headers before tarfile acts on
    them (it reads a long name or PAX header into memory, and expands sparse maps), and turning
    a corrupt or cut header after the first into an error instead of a quiet end of archive.
    The methods it overrides are CPython tarfile's own (the same names from 3.8 to 3.14); the
    sparse and long-header tests of tests/build/base/test_base_rules.py fail if they move."""

    @classmethod
    def fromtarfile(cls, tarfile_: tarfile.TarFile) -> Any:
        first = cast(Any, tarfile_).offset == 0  # the first header: is it a tar at all?
        try:
            return super().fromtarfile(tarfile_)
        except _tar.TruncatedHeaderError as exc:
            raise _Refused(
                f"is truncated (a header is cut short: {exc})", corrupt=True, first=first
            ) from None
        except (_tar.InvalidHeaderError, ValueError, UnicodeError, OverflowError) as exc:
            raise _Refused(f"has a corrupt tar header ({exc})", corrupt=True, first=first) from None

    #: the tree whose limits extended headers count against (set by :func:`open_tar`)
    tree: Tree | None = None

    def _proc_member(self, tarfile_: tarfile.TarFile) -> Any:
        if self.type in _LONG + _PAX:
            if not 0 <= self.size <= MAX_HEADER:
                raise _Refused(f"has a {self.size}-byte extended header (at most {MAX_HEADER})")
            if self.tree is not None:
                self.tree.extended_header(self.size)
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise _Refused(f"member {self.name!r} is sparse; {SPARSE_HINT}")
        return _tar.TarInfo._proc_member(self, tarfile_)

    def _proc_gnusparse_00(self, *_args: Any) -> None:
        raise _Refused(f"holds a sparse member (PAX 0.0); {SPARSE_HINT}")

    def _proc_gnusparse_01(self, *_args: Any) -> None:
        raise _Refused(f"holds a sparse member (PAX 0.1); {SPARSE_HINT}")

    def _proc_gnusparse_10(self, *_args: Any) -> None:
        raise _Refused(f"holds a sparse member (PAX 1.0); {SPARSE_HINT}")


class Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


def open_tar(
    fileobj: Readable | None = None, *, name: Path | None = None, tree: Tree | None = None
) -> tarfile.TarFile:
    """A tar reader using the guarded header (extended headers counted against ``tree``):
    seekable when ``name`` is given, else a stream. Names are read as the layer writer writes
    them (UTF-8, any other byte kept as it was, whatever the locale)."""
    header = type("_TreeHeader", (_Header,), {"tree": tree}) if tree is not None else _Header
    how: dict[str, Any] = {"tarinfo": header, "encoding": "utf-8", "errors": "surrogateescape"}
    if name is not None:
        return tarfile.open(name, "r:", **how)
    stream: Any = fileobj  # tarfile reads a stream through read() alone
    return tarfile.open(fileobj=stream, mode="r|", **how)


def each_member(tf: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """The members of ``tf`` one by one, none kept by it (iterating a ``TarFile`` keeps every
    member read, which for millions of members is gigabytes)."""
    while (m := tf.next()) is not None:
        cast(Any, tf).members.clear()
        yield m


# --- bounded, checked decompression ----------------------------------------------------------


class _Bounded:
    """A read-only stream that counts what passes against the tree's budget and turns every
    decompression failure into a :class:`CorruptArchive` naming the file."""

    def __init__(self, f: Readable, tree: Tree, compressed: int | None, what: str) -> None:
        self.f, self.tree, self.compressed, self.what = f, tree, compressed, what
        self.size = 0
        self.headers = _HeaderWalk(tree)

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            return b"".join(iter(lambda: self.read(CHUNK), b""))
        try:
            data = self.f.read(n)
        except (EOFError, zlib.error, lzma.LZMAError, OSError) as exc:
            raise CorruptArchive(
                self.tree.where, f"is truncated or corrupt ({self.what}: {exc})"
            ) from exc
        self.size += len(data)
        self.tree.charge(len(data), self.size, self.compressed)
        self.headers.feed(data)
        return data


class _HeaderWalk:
    """:func:`count_members` on a stream, as its bytes pass: a tarball of too many members is
    refused while it is being decompressed, at the first header past the limit, not once all
    of it is out. Stops, saying nothing, at the end or at anything it does not follow."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self.limit = tree.limits.max_members - tree.members
        self.pos = 0  # the stream offset just past the bytes fed so far
        self.next_at = 0  # where the next header begins
        self.head = b""  # the first bytes of a header cut by the end of a chunk
        self.count = 0
        self.done = False

    def feed(self, data: bytes) -> None:
        base = self.pos
        self.pos += len(data)
        while not self.done and self.next_at < self.pos:
            rel = self.next_at - base
            if rel < 0:  # the header began in the chunk before: its first bytes are in head
                self.head += data[: 512 - len(self.head)]
            else:
                self.head = data[rel : rel + 512]
            if len(self.head) < 512:
                return  # its other bytes come with the next chunk
            block, self.head = self.head, b""
            size = _header_size(block)
            if size is None:
                self.done = True
                return
            if block[156:157] not in _EXTENSIONS:
                self.count += 1
                if self.count > self.limit:
                    raise self.tree.refuse(
                        f"holds more than {self.tree.limits.max_members} members (the limit on "
                        "members of one base)"
                    )
            self.next_at += 512 + -(-size // 512) * 512


@contextlib.contextmanager
def open_stream(path: Path, compression: str, tree: Tree) -> Iterator[_Bounded]:
    """The uncompressed bytes of ``path`` (gzip, xz, zstd, bzip2 or none), bounded by the
    tree's limits; corrupt or truncated compression is a :class:`CorruptArchive`."""
    compressed = path.stat().st_size if compression != "none" else None
    with contextlib.ExitStack() as stack:
        raw: Any
        if compression == "gzip":
            raw = stack.enter_context(gzip.open(path, "rb"))
        elif compression == "xz":
            raw = stack.enter_context(lzma.open(path, "rb"))
        elif compression == "bzip2":
            raw = stack.enter_context(bz2.open(path, "rb"))
        elif compression == "zstd":
            try:
                with open_uncompressed(path, MEDIA_TYPES[Compression.ZSTD]) as f:
                    yield _Bounded(f, tree, compressed, "zstd")
            except ToolFailed as exc:
                said = exc.output_tail.strip().splitlines()
                raise CorruptArchive(
                    tree.where, f"is truncated or corrupt (zstd: {said[-1] if said else exc})"
                ) from exc
            return
        else:
            raw = stack.enter_context(path.open("rb"))
        yield _Bounded(raw, tree, compressed, compression)


@contextlib.contextmanager
def located(tree: Tree, head: Callable[[], bytes] | None = None) -> Iterator[None]:
    """Turn tarfile's own errors, and the guarded header's, into errors naming the file. When
    the very first header is not a tar header, ``head`` (the stream's first bytes) says what
    the file is instead (a zip, a second compression, a web page …)."""
    try:
        yield
    except _Refused as exc:
        what = describe(head()) if exc.first and head is not None else None
        if what is not None:
            raise CorruptArchive(
                tree.where, f"is not a tar archive: it holds {what}", hint=NOT_TAR_HINT
            ) from None
        cls = CorruptArchive if exc.corrupt else UnsafeArchive
        raise cls(tree.where, str(exc)) from None
    except tarfile.TarError as exc:
        raise CorruptArchive(tree.where, f"is not a readable tar archive ({exc})") from exc


class _Head:
    """A read-only stream that keeps the first bytes read through it (for :func:`describe`)."""

    def __init__(self, f: Readable) -> None:
        self.f, self.head = f, b""

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        if len(self.head) < 512:
            self.head += data[: 512 - len(self.head)]
        return data


def file_head(path: Path) -> bytes:
    with path.open("rb") as f:
        return f.read(512)


def count_members(path: Path, tree: Tree) -> None:
    """Walk the headers of the plain tarball at ``path`` (no member parsed, no data read: a
    checksum and a size each, about a microsecond) and refuse it when it holds more members
    than the tree's limit, before the full reading, which costs a hundred times more per
    member. The walk stops, saying nothing, at the end or at anything it does not follow;
    the full reading then decides."""
    limit = tree.limits.max_members - tree.members
    with path.open("rb") as f:
        try:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file
            return
    with mm:
        end, at, count = len(mm), 0, 0
        while at + 512 <= end:
            block = mm[at : at + 512]
            size = _header_size(block)
            if size is None:
                return
            if block[156:157] not in _EXTENSIONS:
                count += 1
                if count > limit:
                    raise tree.refuse(
                        f"holds more than {tree.limits.max_members} members (the limit on "
                        "members of one base)"
                    )
            at += 512 + -(-size // 512) * 512


#: Header types that describe the next member rather than being one.
_EXTENSIONS = {b"x", b"g", b"X", b"L", b"K"}


def _header_size(block: bytes) -> int | None:
    """The data size a tar header declares, or None when ``block`` is not a valid header (a
    zero block, a bad checksum, a size that is not a number)."""
    try:
        if int(block[148:156].split(b"\0", 1)[0].strip(), 8) != sum(block) - sum(
            block[148:156]
        ) + 8 * ord(" "):
            return None
        field = block[124:136]
        if field[0] & 0x80:
            return int.from_bytes(field[1:], "big")
        digits = field.split(b"\0", 1)[0].strip()
        return int(digits, 8) if digits else 0
    except ValueError:
        return None


# --- the readers ------------------------------------------------------------------------------


def tar_entries(tf: tarfile.TarFile, tree: Tree) -> list[Entry]:
    """The members of a seekable (uncompressed) tarball, opened with :func:`open_tar`, as layer
    entries, checked by ``tree``. Device files (allowed under dev/) are dropped.

    Later members replace earlier ones of the same path (tar semantics). The tarball must stay
    open while the entries are written: file contents are read from it lazily.
    """
    entries: dict[str, Entry] = {}
    assert tf.fileobj is not None
    fd = tf.fileobj.fileno()  # type: ignore[attr-defined]
    end = os.fstat(fd).st_size
    with located(tree):
        for m in each_member(tf):
            path = tree.admit(m)
            if path is None:
                continue
            entries.pop(path, None)
            mode, uid, gid = m.mode & 0o7777, m.uid, m.gid
            if m.isdir():
                entries[path] = Entry(path, Kind.DIR, mode, uid, gid)
            elif m.issym():
                entries[path] = Entry(path, Kind.SYMLINK, mode, uid, gid, linkname=m.linkname)
            elif m.islnk():
                target = member_path(m.linkname, where=tree.where)
                entries[path] = Entry(path, Kind.HARDLINK, mode, uid, gid, linkname=target)
            elif m.isreg():
                if m.offset_data + m.size > end:
                    raise CorruptArchive(tree.where, f"is truncated (member {m.name!r} is cut)")
                source = cast(Opener, functools.partial(_Slice, fd, m.offset_data, m.size))
                entries[path] = Entry(path, Kind.FILE, mode, uid, gid, size=m.size, source=source)
    tree.finish()
    return list(entries.values())


class _Slice(io.RawIOBase):
    """``size`` bytes of the open file ``fd`` from ``offset`` (a member's data), read with
    ``pread``: an entry holds three numbers instead of tarfile's member."""

    def __init__(self, fd: int, offset: int, size: int) -> None:
        self.fd, self.pos, self.left = fd, offset, size

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        n = min(len(buf), self.left)
        data = os.pread(self.fd, n, self.pos) if n else b""
        buf[: len(data)] = data
        self.pos += len(data)
        self.left -= len(data)
        return len(data)


@dataclass(frozen=True)
class Scan:
    members: int
    files: int
    file_bytes: int


def scan(stream: Readable, tree: Tree) -> Scan:
    """Read one layer's uncompressed tar ``stream`` through, every member checked by ``tree``
    (which holds what the lower layers made). Reads to the end of the stream."""
    members = files = file_bytes = 0
    seen = _Head(stream)
    with located(tree, lambda: seen.head), open_tar(seen, tree=tree) as tf:
        for m in each_member(tf):
            tree.admit(m)
            members += 1
            if m.isreg():
                files += 1
                file_bytes += m.size
    while stream.read(CHUNK):
        pass
    return Scan(members, files, file_bytes)


def safe_extract(stream: IO[bytes], target: Path, *, where: str, tree: Tree | None = None) -> int:
    """Unpack the tar ``stream`` (read sequentially) into ``target``, applying whiteouts.
    Returns the number of members written. Nothing is ever written outside ``target``. Pass the
    same ``tree`` for every layer of an image (lower layers' symlinks then count too)."""
    tree = tree or Tree(where)
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    root = os.path.realpath(target)
    count = 0
    written: set[str] = set()  # an opaque whiteout hides lower layers, not this one
    seen = _Head(stream)
    with located(tree, lambda: seen.head), open_tar(seen, tree=tree) as tf:
        for m in each_member(tf):
            path = tree.admit(m)
            if path is None or is_device(m):
                continue
            dest = _safe_dest(root, path, where=where)
            name = posixpath.basename(path)
            if name == OPAQUE:
                _clear_dir(os.path.dirname(dest), keep=written)
                continue
            if name.startswith(WHITEOUT):
                _remove(os.path.join(os.path.dirname(dest), name[len(WHITEOUT) :]))
                continue
            if m.isdir():
                if not os.path.isdir(dest) or os.path.islink(dest):
                    _remove(dest)
                    os.mkdir(dest, 0o700)
                os.chmod(dest, m.mode & 0o7777)
            elif m.issym():
                _remove(dest)
                os.symlink(m.linkname, dest)
            elif m.islnk():
                src = _safe_dest(root, member_path(m.linkname, where=where), where=where)
                st = os.lstat(src) if os.path.lexists(src) else None
                if st is None or not stat.S_ISREG(st.st_mode):
                    raise UnsafeArchive(
                        where, f"hardlink {m.name!r} -> {m.linkname!r} names no extracted file"
                    )
                _remove(dest)
                os.link(src, dest, follow_symlinks=False)
            else:
                _remove(dest)
                fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as out:
                    src_f = tf.extractfile(m)
                    assert src_f is not None
                    shutil.copyfileobj(src_f, out, CHUNK)
                os.chmod(dest, m.mode & 0o7777)
            written.add(dest)
            count += 1
    return count


def _safe_dest(root: str, path: str, *, where: str) -> str:
    """``root/path``, after checking that no existing parent on the way is a symlink (or not a
    directory); missing parents are created as 0755 directories."""
    current = root
    parts = path.split("/")
    for part in parts[:-1]:
        current = os.path.join(current, part)
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            os.mkdir(current, 0o755)
            continue
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise UnsafeArchive(
                where,
                f"member {path!r} would be written through {part!r}, which is not a "
                "directory (a symlink can point anywhere); refusing the archive",
            )
    return os.path.join(current, parts[-1])


def _remove(path: str) -> None:
    if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
        os.unlink(path)
    elif os.path.isdir(path):
        rmtree(Path(path))


def _clear_dir(path: str, *, keep: set[str]) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        for name in os.listdir(path):
            child = os.path.join(path, name)
            if child not in keep:
                _remove(child)
