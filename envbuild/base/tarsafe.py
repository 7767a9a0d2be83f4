"""Reading and extracting base tarballs without ever writing outside the target.

A base comes from outside (a rootfs tarball, a layer of a pulled image), so every member is
checked before it is used:

* a name that is absolute or holds ``..`` is refused;
* a symlink whose relative target climbs out of the root is refused (an absolute target is kept:
  inside the image it names a path of the image, and it is never followed here);
* a hardlink must name a regular file that came earlier in the same archive, inside the root;
* a member below a symlink (``evil -> /etc`` then ``evil/passwd``) is refused;
* device files and fifos are dropped under ``dev/`` (the engine provides /dev) and refused
  elsewhere.

:func:`tar_entries` turns a seekable tarball into layer :class:`~envbuild.layers.Entry` items
(modes and numeric owners kept, contents read lazily); :func:`safe_extract` unpacks a tar stream
(applying whiteouts) into a directory, creating files with ``O_NOFOLLOW | O_EXCL``.
"""

from __future__ import annotations

import logging
import os
import posixpath
import shutil
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

from envbuild.errors import InputFileError
from envbuild.layers import OPAQUE, WHITEOUT, Entry, Kind

log = logging.getLogger("envbuild.base")

CHUNK = 1 << 20


class UnsafeArchive(InputFileError):
    """A base tarball tries to write outside its target, or holds what a layer cannot."""


def member_path(name: str, *, where: str) -> str:
    """A member's name as a relative path (``./a/b/`` -> ``a/b``), or :class:`UnsafeArchive`."""
    if name.startswith("/"):
        raise UnsafeArchive(where, f"member {name!r} has an absolute path; refusing the archive")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchive(where, f"member {name!r} climbs out with '..'; refusing the archive")
    return "/".join(parts)


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
        raise UnsafeArchive(where, f"symlink {path!r} -> {target!r} points outside the root")


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


def _is_device(m: tarfile.TarInfo) -> bool:
    return m.ischr() or m.isblk() or m.isfifo()


def tar_entries(tf: tarfile.TarFile, *, where: str) -> list[Entry]:
    """The members of a seekable (uncompressed) tarball as layer entries, checked as above.

    Later members replace earlier ones of the same path (tar semantics). The tarball must stay
    open while the entries are written: file contents are read from it lazily.
    """
    entries: dict[str, Entry] = {}
    for m in tf.getmembers():
        path = member_path(m.name, where=where)
        if not path:
            continue
        if _is_device(m):
            if path == "dev" or path.startswith("dev/"):
                continue
            raise UnsafeArchive(where, f"member {m.name!r} is a device file or fifo")
        _check_parents(path, entries, where=where)
        mode, uid, gid = m.mode & 0o7777, m.uid, m.gid
        if m.isdir():
            entries[path] = Entry(path, Kind.DIR, mode, uid, gid)
        elif m.issym():
            entries[path] = Entry(path, Kind.SYMLINK, mode, uid, gid, linkname=m.linkname)
            check_symlink(path, m.linkname, where=where, readlink=_known_link(entries))
        elif m.islnk():
            target = member_path(m.linkname, where=where)
            found = entries.get(target)
            if found is None or found.kind not in (Kind.FILE, Kind.HARDLINK):
                raise UnsafeArchive(
                    where, f"hardlink {m.name!r} -> {m.linkname!r} names no earlier regular file"
                )
            entries[path] = Entry(path, Kind.HARDLINK, mode, uid, gid, linkname=target)
        elif m.isreg():
            entries[path] = Entry(
                path, Kind.FILE, mode, uid, gid, size=m.size, source=_opener(tf, m)
            )
        else:
            raise UnsafeArchive(where, f"member {m.name!r} has an unsupported type {m.type!r}")
    return list(entries.values())


def _known_link(entries: dict[str, Entry]) -> Callable[[str], str | None]:
    def readlink(path: str) -> str | None:
        found = entries.get(path)
        return found.linkname if found is not None and found.kind is Kind.SYMLINK else None

    return readlink


def _disk_link(root: str) -> Callable[[str], str | None]:
    def readlink(path: str) -> str | None:
        full = os.path.join(root, path)
        return os.readlink(full) if os.path.islink(full) else None

    return readlink


def _check_parents(path: str, entries: dict[str, Entry], *, where: str) -> None:
    parent = posixpath.dirname(path)
    while parent:
        found = entries.get(parent)
        if found is not None and found.kind is not Kind.DIR:
            raise UnsafeArchive(
                where, f"member {path!r} lies below {parent!r}, which is not a directory"
            )
        parent = posixpath.dirname(parent)


def _opener(tf: tarfile.TarFile, m: tarfile.TarInfo) -> Callable[[], IO[bytes]]:
    def open_member() -> IO[bytes]:
        f = tf.extractfile(m)
        assert f is not None
        return f

    return open_member


def safe_extract(stream: IO[bytes], target: Path, *, where: str) -> int:
    """Unpack the tar ``stream`` (read sequentially) into ``target``, applying whiteouts.
    Returns the number of members written. Nothing is ever written outside ``target``."""
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    root = os.path.realpath(target)
    count = 0
    written: set[str] = set()  # an opaque whiteout hides lower layers, not this one
    with tarfile.open(fileobj=stream, mode="r|*") as tf:
        for m in tf:
            path = member_path(m.name, where=where)
            if not path:
                continue
            if _is_device(m):
                if path == "dev" or path.startswith("dev/"):
                    continue
                raise UnsafeArchive(where, f"member {m.name!r} is a device file or fifo")
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
                try:
                    check_symlink(path, m.linkname, where=where, readlink=_disk_link(root))
                except UnsafeArchive:
                    os.unlink(dest)
                    raise
            elif m.islnk():
                src = _safe_dest(root, member_path(m.linkname, where=where), where=where)
                st = os.lstat(src) if os.path.lexists(src) else None
                if st is None or not stat.S_ISREG(st.st_mode):
                    raise UnsafeArchive(
                        where, f"hardlink {m.name!r} -> {m.linkname!r} names no extracted file"
                    )
                _remove(dest)
                os.link(src, dest, follow_symlinks=False)
            elif m.isreg():
                _remove(dest)
                fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as out:
                    src_f = tf.extractfile(m)
                    assert src_f is not None
                    shutil.copyfileobj(src_f, out, CHUNK)
                os.chmod(dest, m.mode & 0o7777)
            else:
                raise UnsafeArchive(where, f"member {m.name!r} has an unsupported type {m.type!r}")
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
