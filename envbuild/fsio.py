"""Small file helpers every stage shares: atomic writes, canonical JSON, hashing, removing a
tree, and the step-by-step upgrade of a document written in an older format."""

from __future__ import annotations

import binascii
import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from envbuild.errors import EnvironmentFailure, OutputError

log = logging.getLogger(__name__)

CHUNK = 1 << 20


def canonical_json(obj: Any) -> str:
    """Sorted keys, two-space indent, UTF-8 as is, one trailing newline."""
    return json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def compact_json(obj: Any) -> bytes:
    """The form whose sha256 names a value: sorted keys, no whitespace."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


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


def rmtree(path: Path) -> None:
    """Remove ``path``, a file or a tree, read-only folders in it included (an unpacked wheel
    may have them); nothing there is no error."""
    if not path.is_dir() or path.is_symlink():
        path.unlink(missing_ok=True)
        return
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return
    except OSError:
        for dirpath, _dirs, _files in os.walk(path):
            with contextlib.suppress(OSError):
                os.chmod(dirpath, 0o700)
        shutil.rmtree(path, ignore_errors=True)


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


def _output_error(path: Path, exc: OSError) -> Exception:
    if exc.errno == errno.ENOSPC:
        return EnvironmentFailure(f"{path}: no space left on device", hint="free disk space")
    reason = exc.strerror or str(exc)
    return OutputError(
        f"cannot write {path}: {reason}",
        hint="check that the directory exists and is writable, or choose another output path",
    )
