"""Reading base tarballs and layers under one set of rules, never writing outside the target.

A base comes from outside (a rootfs tarball, the layers of an OCI layout or of a pulled image).
Every reader of it — :func:`tar_entries` (a rootfs, re-packed), :func:`scan` (an image layer,
kept as it is) and :func:`safe_extract` (unpacking) — passes each member through
:meth:`Tree.admit`, the one definition of the rules:

* a name that is absolute or holds ``..`` is refused, and so is a path longer than Linux takes
  (4096 bytes, 255 a component);
* a member below a symlink or a non-directory (``evil -> /etc`` then ``evil/passwd``) is refused,
  also when the symlink came from a lower layer of the same image;
* a member that is not a directory may not replace a directory that holds members;
* a symlink whose relative target climbs out of the root (following the symlinks known so far,
  and checked again against the whole tree at the end) is refused; an absolute target names a
  path of the image, and is never followed here;
* a hardlink must name a regular file that came earlier (in the archive or a lower layer), and a
  file a hardlink names may not be replaced afterwards;
* device files and fifos are allowed under ``dev/`` only (a re-packed rootfs drops them: the
  engine provides /dev); sparse members are refused (a 10 KB tarball can declare a 4 GiB file);
  owners are 0 … 2^32-1;
* PAX and GNU long-name headers are at most 1 MiB; a base holds at most :class:`Limits` members
  and uncompressed bytes, counted as the bytes are read (so a bomb stops at the limit);
* a truncated or corrupt compressed stream, a corrupt tar header or a member cut short is a
  :class:`CorruptArchive` naming the file and what is wrong.

Every refusal is a user error (exit 2). Whiteouts (``.wh.<name>``, ``.wh..wh..opq``) hide what
lower layers made, as the OCI image spec says (not what the same layer made).
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import lzma
import os
import posixpath
import shutil
import stat
import tarfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from envbuild.errors import InputFileError, ToolFailed
from envbuild.layers import (
    MEDIA_TYPES,
    OPAQUE,
    WHITEOUT,
    Compression,
    Entry,
    Kind,
    open_uncompressed,
)

CHUNK = 1 << 20
GIB = 1 << 30
#: The largest PAX or GNU long-name header read (tarfile holds one in memory).
MAX_HEADER = 1 << 20
PATH_MAX, NAME_MAX = 4096, 255
MAX_ID = (1 << 32) - 1


class UnsafeArchive(InputFileError):
    """A base tarball tries to write outside its target, or holds what a layer cannot."""


class CorruptArchive(UnsafeArchive):
    """A base tarball or layer is truncated or corrupt (its compression or its tar headers)."""


@dataclass(frozen=True)
class Limits:
    """How much one base may expand to (all its layers together).

    ``max_bytes``: uncompressed tar bytes; ``max_ratio``: uncompressed bytes per compressed byte
    of each stream once past ``ratio_free`` bytes (None: no ratio limit); ``max_members``.
    The defaults are documented in docs/image.md; a spec's ``base.max_unpacked_gib`` replaces
    the byte and ratio limits with its own figure."""

    max_bytes: int = 64 * GIB
    max_ratio: int | None = 100
    ratio_free: int = GIB
    max_members: int = 2_000_000

    @classmethod
    def of(cls, max_unpacked_gib: float | None) -> Limits:
        if max_unpacked_gib is None:
            return cls()
        return cls(max_bytes=int(max_unpacked_gib * GIB), max_ratio=None)


def _gib(n: int) -> str:
    return f"{n / GIB:g} GiB"


class _Refused(Exception):
    """Raised inside tarfile's header parsing; turned into a located error by the reader."""

    def __init__(self, message: str, *, corrupt: bool = False) -> None:
        super().__init__(message)
        self.corrupt = corrupt


_tar: Any = tarfile  # its header errors and _proc_member are not in the stubs
_LONG = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
_PAX = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)


class _Header(tarfile.TarInfo):
    """tarfile's member, refusing sparse members and oversized headers before tarfile acts on
    them (it reads a long name or PAX header into memory, and expands sparse maps), and turning
    a corrupt or cut header after the first into an error instead of a quiet end of archive."""

    @classmethod
    def fromtarfile(cls, tarfile_: tarfile.TarFile) -> Any:
        try:
            return super().fromtarfile(tarfile_)
        except _tar.TruncatedHeaderError as exc:
            raise _Refused(f"is truncated (a header is cut short: {exc})", corrupt=True) from None
        except _tar.InvalidHeaderError as exc:
            raise _Refused(f"has a corrupt tar header ({exc})", corrupt=True) from None
        except (ValueError, UnicodeError, OverflowError) as exc:
            raise _Refused(f"has a corrupt tar header ({exc})", corrupt=True) from None

    def _proc_member(self, tarfile_: tarfile.TarFile) -> Any:
        if self.type in _LONG + _PAX and not 0 <= self.size <= MAX_HEADER:
            raise _Refused(f"has a {self.size}-byte extended header (at most {MAX_HEADER})")
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise _Refused(f"member {self.name!r} is sparse; {_SPARSE}")
        return _tar.TarInfo._proc_member(self, tarfile_)

    def _proc_gnusparse_00(self, *_args: Any) -> None:
        raise _Refused(f"holds a sparse member (PAX 0.0); {_SPARSE}")

    def _proc_gnusparse_01(self, *_args: Any) -> None:
        raise _Refused(f"holds a sparse member (PAX 0.1); {_SPARSE}")

    def _proc_gnusparse_10(self, *_args: Any) -> None:
        raise _Refused(f"holds a sparse member (PAX 1.0); {_SPARSE}")


_SPARSE = "sparse members are refused (re-create the archive without --sparse)"


class Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


def open_tar(fileobj: Readable | None = None, *, name: Path | None = None) -> tarfile.TarFile:
    """A tar reader using the guarded header: seekable when ``name`` is given, else a stream."""
    if name is not None:
        return tarfile.open(name, "r:", tarinfo=_Header)
    stream: Any = fileobj  # tarfile reads a stream through read() alone
    return tarfile.open(fileobj=stream, mode="r|", tarinfo=_Header)


# --- the rules --------------------------------------------------------------------------------


class _Node:
    __slots__ = ("children", "kind", "layer", "link")

    def __init__(self, kind: str, layer: int, link: str = "") -> None:
        self.kind = kind  # "dir", "file", "symlink" or "device"
        self.layer = layer
        self.link = link
        self.children: dict[str, _Node] = {}


def member_path(name: str, *, where: str) -> str:
    """A member's name as a relative path (``./a/b/`` -> ``a/b``), or :class:`UnsafeArchive`."""
    if name.startswith("/"):
        raise UnsafeArchive(where, f"member {name!r} has an absolute path; refusing the archive")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchive(where, f"member {name!r} climbs out with '..'; refusing the archive")
    path = "/".join(parts)
    if len(path.encode(errors="surrogateescape")) > PATH_MAX or any(
        len(p.encode(errors="surrogateescape")) > NAME_MAX for p in parts
    ):
        raise UnsafeArchive(where, f"member {name[:80]!r}… has a name longer than Linux takes")
    return path


def check_symlink(
    path: str, target: str, *, where: str, readlink: Callable[[str], str | None] | None = None
) -> None:
    """Refuse a relative symlink target that climbs out of the root, following the symlinks
    ``readlink`` knows of on the way (``d/up -> ..`` then ``x -> d/up/../..`` climbs out).
    An absolute target names a path of the image and is allowed (never followed here)."""
    if not target:
        raise UnsafeArchive(where, f"symlink {path!r} has an empty target")
    if target.startswith("/"):
        return
    if _climbs_out(posixpath.dirname(path), target, readlink or (lambda _p: None)):
        raise UnsafeArchive(
            where, f"symlink {path!r} -> {target!r} points outside the root (or loops)"
        )


def _climbs_out(start: str, target: str, readlink: Callable[[str], str | None]) -> bool:
    resolved = [p for p in start.split("/") if p]
    queue = [p for p in target.split("/") if p not in ("", ".")]
    hops = 0
    while queue:
        part = queue.pop(0)
        if part == "..":
            if not resolved:
                return True
            resolved.pop()
            continue
        resolved.append(part)
        link = readlink("/".join(resolved))
        if link is None:
            continue
        hops += 1
        if hops > 40:
            return True  # a loop; refuse rather than guess
        resolved.pop()
        if link.startswith("/"):
            resolved = []
        queue = [p for p in link.split("/") if p not in ("", ".")] + queue
    return False


def is_device(m: tarfile.TarInfo) -> bool:
    return m.ischr() or m.isblk() or m.isfifo()


class Tree:
    """What the members read so far make of the root, and the budget they have used. One tree
    reads a whole base (every layer of an image, in order: call :meth:`next_layer` between)."""

    def __init__(self, where: str, limits: Limits | None = None) -> None:
        self.where = where
        self.limits = limits or Limits()
        self.root = _Node("dir", 0)
        self.layer = 0
        self.members = 0
        self.bytes = 0
        self.hardlinked: set[str] = set()

    def charge(self, n: int, stream_bytes: int = 0, compressed: int | None = None) -> None:
        """Count ``n`` more uncompressed bytes against the limits (``stream_bytes`` of the
        current stream so far, from ``compressed`` bytes when it is compressed)."""
        self.bytes += n
        limits = self.limits
        hint = "if the base really is that big, set base.max_unpacked_gib in the spec"
        if self.bytes > limits.max_bytes:
            raise UnsafeArchive(
                self.where, f"expands to more than {_gib(limits.max_bytes)}", hint=hint
            )
        if (
            limits.max_ratio is not None
            and compressed is not None
            and stream_bytes > limits.ratio_free
            and stream_bytes > limits.max_ratio * compressed
        ):
            raise UnsafeArchive(
                self.where,
                f"expands more than {limits.max_ratio} times ({compressed} bytes to over "
                f"{stream_bytes}): a decompression bomb?",
                hint=hint,
            )

    def next_layer(self) -> None:
        self.layer += 1
        self.hardlinked = set()  # what a lower layer's hardlinks name may be replaced

    def refuse(self, message: str) -> UnsafeArchive:
        return UnsafeArchive(self.where, message)

    def _parent(self, parts: list[str], name: str) -> _Node:
        node = self.root
        for i, part in enumerate(parts[:-1]):
            child = node.children.get(part)
            if child is None:
                child = node.children[part] = _Node("dir", self.layer)
            elif child.kind != "dir":
                below = "/".join(parts[: i + 1])
                raise self.refuse(
                    f"member {name!r} lies below {below!r}, which is a {child.kind}, not a "
                    "directory (a symlink can point anywhere); refusing the archive"
                )
            node = child
        return node

    def _lookup(self, path: str) -> _Node | None:
        node: _Node | None = self.root
        for part in path.split("/"):
            if node is None or node.kind != "dir":
                return None
            node = node.children.get(part)
        return node

    def readlink(self, path: str) -> str | None:
        node = self._lookup(path)
        return node.link if node is not None and node.kind == "symlink" else None

    def admit(self, m: tarfile.TarInfo) -> str | None:
        """Check one member against the rules and record it; its path, or None for the root
        directory's own entry. Raises :class:`UnsafeArchive`."""
        self.members += 1
        if self.members > self.limits.max_members:
            raise self.refuse(f"holds more than {self.limits.max_members} members")
        path = member_path(m.name, where=self.where)
        if m.issparse():
            raise self.refuse(f"member {m.name!r} is sparse; {_SPARSE}")
        if m.size < 0 or not (0 <= m.uid <= MAX_ID and 0 <= m.gid <= MAX_ID):
            raise self.refuse(f"member {m.name!r} has a negative size or an impossible owner")
        if not path:
            if not m.isdir():
                raise self.refuse(f"member {m.name!r} would replace the root with a non-directory")
            return None
        parts = path.split("/")
        parent = self._parent(parts, path)
        name = parts[-1]
        if name.startswith(WHITEOUT) and not (m.isreg() and not m.islnk()):
            raise self.refuse(f"whiteout {m.name!r} is not a plain file")
        if name == OPAQUE:
            for key in [k for k, c in parent.children.items() if c.layer < self.layer]:
                self._drop(parent, key, path)
            return path
        if name.startswith(WHITEOUT):
            hidden = parent.children.get(name[len(WHITEOUT) :])
            if hidden is not None and hidden.layer < self.layer:
                self._drop(parent, name[len(WHITEOUT) :], path)
            return path
        existing = parent.children.get(name)
        if m.isdir():
            if existing is not None and existing.kind == "dir":
                existing.layer = self.layer
                return path
            node = _Node("dir", self.layer)
        elif m.issym():
            check_symlink(path, m.linkname, where=self.where, readlink=self.readlink)
            node = _Node("symlink", self.layer, m.linkname)
        elif m.islnk():
            target = member_path(m.linkname, where=self.where)
            found = self._lookup(target) if target else None
            if target == path or found is None or found.kind != "file":
                raise self.refuse(
                    f"hardlink {m.name!r} -> {m.linkname!r} names no earlier regular file"
                )
            self.hardlinked.add(target)
            node = _Node("file", self.layer)
        elif m.isreg():
            node = _Node("file", self.layer)
        elif is_device(m):
            if parts[0] != "dev":
                raise self.refuse(f"member {m.name!r} is a device file or fifo outside dev/")
            node = _Node("device", self.layer)
        else:
            raise self.refuse(f"member {m.name!r} has an unsupported type {m.type!r}")
        if existing is not None:
            if existing.kind == "dir" and existing.children:
                raise self.refuse(
                    f"member {m.name!r} replaces the directory {path!r}, which holds members"
                )
            if path in self.hardlinked:
                raise self.refuse(f"member {m.name!r} replaces a file that a hardlink names")
        parent.children[name] = node
        return path

    def _drop(self, parent: _Node, name: str, whiteout: str) -> None:
        prefix = posixpath.join(posixpath.dirname(whiteout), name)
        if any(p == prefix or p.startswith(prefix + "/") for p in self.hardlinked):
            raise self.refuse(f"whiteout {whiteout!r} removes a file that a hardlink names")
        del parent.children[name]

    def finish(self) -> None:
        """Check every relative symlink again against the whole tree (a later member can move
        where an earlier link leads)."""
        stack: list[tuple[str, _Node]] = [("", self.root)]
        while stack:
            prefix, node = stack.pop()
            for name, child in node.children.items():
                path = f"{prefix}/{name}" if prefix else name
                if child.kind == "symlink":
                    check_symlink(path, child.link, where=self.where, readlink=self.readlink)
                elif child.kind == "dir":
                    stack.append((path, child))


# --- bounded, checked decompression ----------------------------------------------------------


class _Bounded:
    """A read-only stream that counts what passes against the tree's budget and turns every
    decompression failure into a :class:`CorruptArchive` naming the file."""

    def __init__(self, f: Readable, tree: Tree, compressed: int | None, what: str) -> None:
        self.f, self.tree, self.compressed, self.what = f, tree, compressed, what
        self.size = 0

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
        return data


#: Magic numbers of the compressions a rootfs tarball may have.
MAGIC = {
    b"\x1f\x8b": "gzip",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
}


def sniff(path: Path) -> str:
    """The compression of the file at ``path`` by its magic number ("none" when it has none)."""
    with path.open("rb") as f:
        head = f.read(10)
    if head.startswith(b"BZh") and head[3:4].isdigit() and head[4:10] == b"1AY&SY":
        return "bzip2"  # "BZh" alone could begin a tar member's name
    return next((name for magic, name in MAGIC.items() if head.startswith(magic)), "none")


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
def located(tree: Tree) -> Iterator[None]:
    """Turn tarfile's own errors, and the guarded header's, into errors naming the file."""
    try:
        yield
    except _Refused as exc:
        cls = CorruptArchive if exc.corrupt else UnsafeArchive
        raise cls(tree.where, str(exc)) from None
    except tarfile.TarError as exc:
        raise CorruptArchive(tree.where, f"is not a readable tar archive ({exc})") from exc


# --- the readers ------------------------------------------------------------------------------


def tar_entries(tf: tarfile.TarFile, tree: Tree) -> list[Entry]:
    """The members of a seekable (uncompressed) tarball, opened with :func:`open_tar`, as layer
    entries, checked by ``tree``. Device files (allowed under dev/) are dropped.

    Later members replace earlier ones of the same path (tar semantics). The tarball must stay
    open while the entries are written: file contents are read from it lazily.
    """
    entries: dict[str, Entry] = {}
    assert tf.fileobj is not None
    end = os.fstat(tf.fileobj.fileno()).st_size  # type: ignore[attr-defined]
    with located(tree):
        for m in tf:
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
                entries[path] = Entry(
                    path, Kind.FILE, mode, uid, gid, size=m.size, source=_opener(tf, m, tree)
                )
    tree.finish()
    return list(entries.values())


def _opener(tf: tarfile.TarFile, m: tarfile.TarInfo, tree: Tree) -> Callable[[], IO[bytes]]:
    def open_member() -> IO[bytes]:
        with located(tree):
            f = tf.extractfile(m)
        assert f is not None
        return f

    return open_member


@dataclass(frozen=True)
class Scan:
    members: int
    files: int
    file_bytes: int


def scan(stream: Readable, tree: Tree) -> Scan:
    """Read one layer's uncompressed tar ``stream`` through, every member checked by ``tree``
    (which holds what the lower layers made). Reads to the end of the stream."""
    members = files = file_bytes = 0
    with located(tree), open_tar(stream) as tf:
        for m in tf:
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
    with located(tree), open_tar(stream) as tf:
        for m in tf:
            path = tree.admit(m)
            if path is None or (is_device(m)):
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
        shutil.rmtree(path)


def _clear_dir(path: str, *, keep: set[str]) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        for name in os.listdir(path):
            child = os.path.join(path, name)
            if child not in keep:
                _remove(child)
