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
import stat
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import IO

from pydantic import BaseModel, ConfigDict

from envbuild import proc
from envbuild.errors import InputFileError, UserError
from envbuild.store import Store

log = logging.getLogger("envbuild.layers")

CHUNK = 1 << 20
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
            st = child.stat(follow_symlinks=False)
            mode = st.st_mode
            if stat.S_ISDIR(mode):
                found.append((os.fsencode(path), Entry(path, Kind.DIR, 0o755), None))
                walk(Path(child.path), path)
            elif stat.S_ISLNK(mode):
                target = os.readlink(child.path)
                found.append(
                    (os.fsencode(path), Entry(path, Kind.SYMLINK, 0o777, linkname=target), None)
                )
            elif stat.S_ISREG(mode):
                perm = 0o755 if mode & 0o111 else 0o644
                entry = Entry(path, Kind.FILE, perm, size=st.st_size, source=Path(child.path))
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


def arrange(entries: Iterable[Entry]) -> list[Entry]:
    """Normalize paths, refuse duplicates, add missing parents, sort bytewise, and make the
    first path of each hardlink group (in sort order) the one that holds the content."""
    by_path: dict[str, Entry] = {}
    for entry in entries:
        path = normalize_path(entry.path)
        if not path:
            continue  # the layer's root directory is the image's /, not an entry
        linkname = entry.linkname
        if entry.kind is Kind.HARDLINK:
            linkname = normalize_path(linkname)
        fixed = replace(entry, path=path, linkname=linkname)
        if path in by_path and by_path[path] != fixed:
            raise LayerError(f"the layer has two different entries for {path!r}")
        by_path[path] = fixed
    for path in list(by_path):
        parent = PurePosixPath(path).parent
        while str(parent) != ".":
            key = str(parent)
            if key not in by_path:
                by_path[key] = Entry(key, Kind.DIR, 0o755)
            elif by_path[key].kind is not Kind.DIR:
                raise LayerError(f"{path!r} is inside {key!r}, which is not a directory")
            parent = parent.parent
    groups: dict[str, list[str]] = {}
    for path, entry in by_path.items():
        if entry.kind is Kind.HARDLINK:
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
    """Collects small writes into 1 MiB chunks for ``out``."""

    def __init__(self, out: Callable[[bytes | bytearray | memoryview], None]) -> None:
        self.out = out
        self.buf = bytearray()
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.size += len(data)
        if len(self.buf) + len(data) > CHUNK:
            self.flush()
        if len(data) >= CHUNK:
            self.out(data)
        else:
            self.buf += data

    def flush(self) -> None:
        if self.buf:
            self.out(bytes(self.buf))
            self.buf.clear()


@dataclass
class _Counts:
    entries: int = 0
    files: int = 0
    file_bytes: int = 0


def write_tar(entries: list[Entry], sink: Sink, mtime: int) -> _Counts:
    counts = _Counts()
    chunk = bytearray(CHUNK)
    for entry in entries:
        info = tarfile.TarInfo(entry.path)
        info.mtime = mtime
        info.mode = entry.mode & 0o7777
        info.uid, info.gid = entry.uid, entry.gid
        info.uname = info.gname = ""
        if entry.kind is Kind.DIR:
            info.type = tarfile.DIRTYPE
        elif entry.kind is Kind.SYMLINK:
            info.type, info.linkname = tarfile.SYMTYPE, entry.linkname
        elif entry.kind is Kind.HARDLINK:
            info.type, info.linkname = tarfile.LNKTYPE, entry.linkname
        else:
            info.type, info.size = tarfile.REGTYPE, entry.size
        sink.write(info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape"))
        counts.entries += 1
        if entry.kind is not Kind.FILE:
            continue
        counts.files += 1
        counts.file_bytes += entry.size
        if entry.size:
            _copy_content(entry, sink, chunk)
            if entry.size % BLOCK:
                sink.write(bytes(BLOCK - entry.size % BLOCK))
    end = 2 * BLOCK
    sink.write(bytes(end + (-(sink.size + end)) % RECORD))
    sink.flush()
    return counts


def _copy_content(entry: Entry, sink: Sink, chunk: bytearray) -> None:
    if entry.source is None:
        raise LayerError(f"{entry.path!r} has {entry.size} bytes but no source")
    left = entry.size
    view = memoryview(chunk)
    try:
        f = entry.source.open("rb") if isinstance(entry.source, Path) else entry.source()
    except OSError as exc:
        raise InputFileError(str(entry.source), f"cannot read: {exc.strerror}") from exc
    with f:
        while left:
            n = f.readinto(view[: min(left, CHUNK)])  # type: ignore[attr-defined]
            if not n:
                break
            sink.write(view[:n])
            left -= n
        if left or f.read(1):
            raise InputFileError(
                str(entry.source) if isinstance(entry.source, Path) else entry.path,
                "changed size while it was being packed",
                hint="do not modify the tree during a build",
            )


def write_layer(
    store: Store,
    entries: Iterable[Entry],
    *,
    compression: Compression = Compression.ZSTD,
    level: int | None = None,
    mtime: int | None = None,
) -> Layer:
    """Write ``entries`` as one deterministic layer blob into ``store`` and describe it."""
    arranged = arrange(entries)
    level = DEFAULT_LEVEL[compression] if level is None else level
    mtime = source_date_epoch() if mtime is None else mtime
    diff = hashlib.sha256()
    with store.blob_writer() as blob:
        if compression is Compression.NONE:

            def out(data: bytes | bytearray | memoryview) -> None:
                diff.update(data)
                blob.write(data)

            sink = Sink(out)
            counts = write_tar(arranged, sink, mtime)
        else:
            argv = _compress_argv(compression, level)
            with proc.filter_bytes(argv, blob.write, hint=_install_hint(argv[0])) as feed:

                def out(data: bytes | bytearray | memoryview) -> None:
                    diff.update(data)
                    feed(data)

                sink = Sink(out)
                counts = write_tar(arranged, sink, mtime)
    layer = Layer(
        digest=blob.digest,
        diff_id=f"sha256:{diff.hexdigest()}",
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


def layer_from_tree(
    store: Store,
    root: Path,
    *,
    prefix: str = "",
    compression: Compression = Compression.ZSTD,
    level: int | None = None,
    mtime: int | None = None,
    extra: Iterable[Entry] = (),
) -> Layer:
    """Pack the tree at ``root`` (placed under ``prefix``), plus ``extra`` entries (whiteouts)."""
    entries = [*tree_entries(root, prefix=prefix), *extra]
    return write_layer(store, entries, compression=compression, level=level, mtime=mtime)


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
