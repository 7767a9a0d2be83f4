"""Small file helpers every stage shares: atomic writes, canonical JSON, hashing, removing a
tree, and the step-by-step upgrade of a document written in an older format."""

from __future__ import annotations

import binascii
import contextlib
import ctypes
import errno
import hashlib
import json
import logging
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from envbuild.errors import NoSpace, OutputError, RemovalRefused

log = logging.getLogger(__name__)

CHUNK = 1 << 20


def _json(obj: Any, **how: Any) -> str:
    """UTF-8 as is; a value holding a name that is not UTF-8 (a file name read from an archive
    or a disk, kept as surrogates) makes the whole document ``\\uXXXX``-escaped instead, so
    that it can be written and read back as it was, never a UnicodeEncodeError."""
    text = json.dumps(obj, sort_keys=True, ensure_ascii=False, **how)
    try:
        text.encode()
    except UnicodeEncodeError:
        return json.dumps(obj, sort_keys=True, ensure_ascii=True, **how)
    return text


def canonical_json(obj: Any) -> str:
    """Sorted keys, two-space indent, UTF-8 as is, one trailing newline."""
    return _json(obj, indent=2) + "\n"


def compact_json(obj: Any) -> bytes:
    """The form whose sha256 names a value: sorted keys, no whitespace."""
    return _json(obj, separators=(",", ":")).encode()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


_URLSAFE = bytes.maketrans(b"+/", b"-_")


def record_digest(digest: bytes) -> str:
    """A digest as a wheel's RECORD writes it after ``sha256=``: urlsafe base64 without padding
    (binascii and a translation rather than base64's wrappers: the snapshot runs it per file)."""
    return binascii.b2a_base64(digest, newline=False).translate(_URLSAFE).rstrip(b"=").decode()


def fsync_dir(path: Path) -> None:
    """Make the entries of folder ``path`` (a rename, an unlink) reach the disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_writer(path: Path, mode: int = 0o644) -> Iterator[IO[bytes]]:
    """Write ``path`` through a temporary file in the same directory, renamed into place only when
    the block finishes: a crash or an error leaves the old file (or none), never half a file.
    The file is synced before the rename and its folder after it, so once the block is over the
    new file survives a crash (a file that marks work as done is not lost with the folder's
    entry)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _output_error(path, exc) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise _output_error(path, exc) from exc
        raise


#: Turns a document of format N into format N + 1.
Converter = Callable[[dict[str, Any]], dict[str, Any]]


#: /proc/self/mountinfo: what is mounted where, as this process sees it.
MOUNTINFO = Path("/proc/self/mountinfo")
_MNT_DETACH = 2  # umount2's flag: detach now, let go of the file system once it is unused
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _unescape(field: str) -> str:
    """A mountinfo path: the kernel writes space, tab, newline and backslash as octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mounts_under(path: Path) -> list[tuple[str, str]]:
    """What is mounted at or beneath ``path`` (an absolute, resolved path): each mount point and
    its file system type, deepest first."""
    top = os.fspath(path)
    found = []
    try:
        text = MOUNTINFO.read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        return []
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) < 7 or "-" not in fields[6:]:
            continue
        point = _unescape(fields[4])
        fstype = fields[fields.index("-", 6) + 1]
        if point == top or point.startswith(top.rstrip("/") + "/"):
            found.append((point, fstype))
    return sorted(found, key=lambda m: (-m[0].count("/"), m[0]))


def _detach(point: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(os.fsencode(point), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err != errno.EINVAL:  # EINVAL: no longer a mount point (gone with its parent)
            raise OSError(err, os.strerror(err), point)


def _refused(
    path: Path, point: str, what: str, unmount: bool, done: str = "nothing was removed"
) -> RemovalRefused:
    if unmount:
        fix = f"unmount it (umount -l {point}) and rerun"
    else:
        fix = (
            f"envbuild did not mount it: unmount it yourself (umount {point}) if nothing uses "
            "it, or move it out of the way, then rerun"
        )
    return RemovalRefused(
        f"refusing to remove {path}: {what} {point}; {done}", hint=fix, path=str(path), mount=point
    )


def rmtree(path: Path, *, unmount: bool = False) -> None:
    """Remove ``path``, a file or a tree, read-only folders in it included (an unpacked wheel
    may have them); nothing there is no error.

    A removal never crosses into another file system: envbuild runs as root, and a bind mount
    left in a folder (mmdebstrap's chroot binds the host's /dev, /dev/shm, /proc and /sys) must
    not be emptied with it. What is mounted at or beneath ``path`` is detached first
    (``umount -l``, deepest first) when ``unmount`` says the folder is one of envbuild's chroots
    (what is mounted there is envbuild's or its mmdebstrap's); otherwise, and for a folder on
    another device than ``path`` that no mount explains, :class:`RemovalRefused` is raised and
    nothing is removed or changed. The walk goes by file descriptors (no symlink is followed)
    and checks every folder's device and inode against what its parent listed, so a mount that
    appears during the removal stops it there."""
    path = Path(os.path.abspath(path))
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        path.unlink(missing_ok=True)
        return
    real = Path(os.path.realpath(path))
    for _round in range(8):  # stacked mounts: each round detaches the top ones
        mounted = mounts_under(real)
        if not mounted:
            break
        point, fstype = mounted[0]
        if not unmount:
            raise _refused(path, point, f"a file system ({fstype}) is mounted at", unmount)
        for point, fstype in mounted:
            try:
                _detach(point)
            except OSError as exc:
                what = f"cannot unmount ({exc.strerror}) the {fstype} mounted at"
                raise _refused(path, point, what, unmount) from exc
            log.info("unmounted %s (%s), left in %s", point, fstype, path)
    else:
        raise _refused(path, mounts_under(real)[0][0], "something is still mounted at", unmount)
    try:
        top = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        return
    try:
        _remove_below(path, top, st)
    finally:
        os.close(top)
    _quietly(os.rmdir, path)


def _quietly(remove: Callable[..., None], *args: Any, **kwargs: Any) -> None:
    """One unlink or rmdir; gone already is fine, anything else is logged (a removal is
    cleanup: it must not hide the error that led to it)."""
    try:
        remove(*args, **kwargs)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not remove %s: %s", exc.filename or args[0], exc.strerror or exc)


def _remove_below(path: Path, top: int, top_st: os.stat_result) -> None:
    """Empty the folder open as ``top`` (``path``, on the device of ``top_st``), depth first
    without recursion (a tree may be deeper than Python's stack)."""
    stack: list[tuple[int, str, list[os.DirEntry[str]]]] = [(top, "", _listing(top))]
    try:
        while stack:
            fd, rel, entries = stack[-1]
            while entries:
                entry = entries.pop()
                if not entry.is_dir(follow_symlinks=False):
                    _unlink(entry.name, fd)
                    continue
                child = _open_child(path, fd, os.path.join(rel, entry.name), entry, top_st)
                if child is not None:
                    stack.append((child, os.path.join(rel, entry.name), _listing(child)))
                    break
            else:
                stack.pop()
                if stack:
                    os.close(fd)
                    _unlink(os.path.basename(rel), stack[-1][0], folder=True)
    finally:
        for fd, _rel, _entries in stack[1:]:
            os.close(fd)


def _open_child(
    path: Path, fd: int, rel: str, entry: os.DirEntry[str], top_st: os.stat_result
) -> int | None:
    """Open the folder ``entry`` of the folder open as ``fd`` to empty it; None when it is gone
    or cannot be opened. Raises :class:`RemovalRefused` when it is another file system: a device
    other than the top's, or a mount point (a bind of the same file system shows as an inode
    other than the one its parent lists; overlayfs lists other inodes too, so mountinfo says)."""
    where = path / rel
    try:
        child = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        return None
    except PermissionError:  # a folder without r-x (not root): its own mode, never a mount's
        if mounts_under(Path(os.path.realpath(where))):
            raise _refused(
                path, str(where), "a file system is mounted at", False, _STOPPED
            ) from None
        with contextlib.suppress(OSError):
            os.chmod(entry.name, 0o700, dir_fd=fd)
        try:
            child = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            log.warning("could not open %s: %s", where, exc.strerror or exc)
            return None
    except OSError as exc:
        log.warning("could not open %s: %s", where, exc.strerror or exc)
        return None
    st = os.fstat(child)
    if st.st_dev != top_st.st_dev or (
        st.st_ino != entry.inode() and mounts_under(Path(os.path.realpath(where)))
    ):
        os.close(child)
        raise _refused(path, str(where), "another file system is at", False, _STOPPED)
    return child


_STOPPED = "the removal stopped there"


def _listing(fd: int) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(fd) as it:
            return list(it)
    except OSError as exc:
        log.warning("could not list a folder to remove: %s", exc.strerror or exc)
        return []


def _unlink(name: str, dir_fd: int, *, folder: bool = False) -> None:
    remove = os.rmdir if folder else os.unlink
    try:
        remove(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except PermissionError:  # a read-only folder (not root): its own mode, never across a mount
        with contextlib.suppress(OSError):
            os.fchmod(dir_fd, 0o700)
        _quietly(remove, name, dir_fd=dir_fd)
    except OSError as exc:
        log.warning("could not remove %s: %s", name, exc.strerror or exc)


def upgrade_format(
    data: dict[str, Any],
    version: int,
    latest: int,
    converters: Mapping[int, Converter],
    *,
    stamp: Callable[[dict[str, Any], int], None],
    too_old: Callable[[int], Exception],
    what: str,
) -> dict[str, Any]:
    """Convert ``data``, a document in format ``version``, one step at a time to ``latest``:
    ``converters[n]`` turns format n into n + 1, then ``stamp(data, n + 1)`` writes the new
    format into it. A format no converter reads raises ``too_old(n)``. Each step is logged as
    ``what`` followed by the two formats (``lock.toml: converting lock format 2 to 3``)."""
    while version < latest:
        convert = converters.get(version)
        if convert is None:
            raise too_old(version)
        log.info("%s %d to %d", what, version, version + 1)
        data = convert(data)
        version += 1
        stamp(data, version)
    return data


def write_atomic(path: Path, data: bytes | str, mode: int = 0o644) -> None:
    with atomic_writer(path, mode) as f:
        f.write(data.encode() if isinstance(data, str) else data)


#: The errors of a full file system (or a reached quota).
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # unreachable


def no_space(
    folder: Path | str, *, doing: str, needed: int | None = None, hint: str | None = None
) -> NoSpace:
    """The :class:`NoSpace` for ``folder`` (or the nearest existing folder above it) while
    ``doing`` something: how much room its file system has left, and ``needed`` when known."""
    where = Path(folder)
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        fs = os.statvfs(where)
    except OSError:
        available, room = None, "its free space unknown"
    else:
        available = fs.f_bavail * fs.f_frsize
        room = f"{human_bytes(available)} free of {human_bytes(fs.f_blocks * fs.f_frsize)}"
    want = f", {human_bytes(needed)} needed" if needed is not None else ""
    return NoSpace(
        f"no space left in {folder} while {doing} ({room}{want})",
        folder=str(folder),
        available=available,
        needed=needed,
        hint=hint
        or f"free space on the file system of {where}, or point envbuild elsewhere "
        "(TMPDIR for temporary files, --store / ENVBUILD_STORE for the store)",
    )


def _output_error(path: Path, exc: OSError) -> Exception:
    if exc.errno in NO_SPACE:
        return no_space(path.parent, doing=f"writing {path.name}")
    reason = exc.strerror or str(exc)
    return OutputError(
        f"cannot write {path}: {reason}",
        hint="check that the directory exists and is writable, or choose another output path",
    )
