"""Reading the ``.dist-info`` folders of site-packages: a distribution's RECORD first (the file
check needs it), then its name, version and installer from its metadata. A metadata file that
exists but cannot be read is noted on the distribution (the check would be incomplete), never
skipped silently.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import stat
from collections.abc import Iterable, Sequence
from email.parser import HeaderParser
from pathlib import Path

from packaging.tags import Tag, parse_tag
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from envbuild.errors import UnreadableFiles
from envbuild.snapshot import records
from envbuild.snapshot.records import Dist

log = logging.getLogger(__name__)


def _headers(text: str) -> dict[str, str]:
    """The header fields of a METADATA file. Only the block before the first empty line is
    parsed: that is where the email parser stops for headers, and a long description after
    it made parsing cost more than reading the RECORDs."""
    head = text.replace("\r\n", "\n").split("\n\n", 1)[0]
    return dict(HeaderParser().parsestr(head, headersonly=True).items())


class _Unreadable(Exception):
    """A metadata file that exists but cannot be read; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC  # O_NONBLOCK: a FIFO never waits


def _read_file(path: str) -> tuple[bytes, int] | None:
    """The bytes and mtime of a file in a .dist-info folder; None when there is no such file.
    One that exists but cannot be read (permissions, a FIFO, a dangling symlink) raises
    :class:`_Unreadable`: the check would be incomplete without it."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise _Unreadable(exc.strerror or str(exc)) from exc
        if os.path.islink(path):
            raise _Unreadable("broken symbolic link") from exc
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Unreadable("not a regular file")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    except OSError as exc:
        raise _Unreadable(exc.strerror or str(exc)) from exc
    finally:
        os.close(fd)
    return b"".join(chunks), st.st_mtime_ns


def read_dist(site: str, dist_info: str) -> Dist:
    """A distribution's RECORD, which the check needs first; its name and version are guessed
    from the folder's until :func:`describe` reads its metadata."""
    stem = dist_info.removesuffix(".dist-info")
    name_guess, _, version_guess = stem.partition("-")
    dist = Dist(canonicalize_name(name_guess), version_guess or "unknown", None, site, dist_info)
    found = _read_meta(dist, "RECORD")
    if found is None:  # no RECORD (some installers write none), or one that cannot be read
        return dist
    raw, dist.record_mtime_ns = found
    dist.record_sha256 = hashlib.sha256(raw).hexdigest()
    dist.record = records.lines(raw)
    return dist


def _read_meta(dist: Dist, name: str) -> tuple[bytes, int] | None:
    path = os.path.join(dist.site, dist.dist_info, name)
    try:
        return _read_file(path)
    except _Unreadable as exc:
        dist.unreadable.append((path, exc.reason))
        return None


def describe(dist: Dist) -> None:
    """Name, version and installer from the distribution's metadata (the email parser is slow
    enough to run while the files are checked, not before)."""
    before = len(dist.unreadable)
    meta = _read_meta(dist, "METADATA")
    if meta is None and len(dist.unreadable) == before:  # none, rather than unreadable
        meta = _read_meta(dist, "PKG-INFO")
    headers = _headers(meta[0].decode("utf-8", errors="replace")) if meta else {}
    dist.name = canonicalize_name(headers.get("Name", dist.name))
    dist.version = headers.get("Version", dist.version) or "unknown"
    found = _read_meta(dist, "INSTALLER")
    dist.installer = found[0].decode("utf-8", errors="replace").strip() or None if found else None


def find_dists(requested: str, sites: Iterable[str]) -> list[Dist]:
    """Every distribution of the given site-packages folders (by folder name), its RECORD read;
    a folder that cannot be listed is :class:`UnreadableFiles`."""
    out = []
    for site in sites:
        try:
            names = os.listdir(site)
        except OSError as exc:
            raise UnreadableFiles(
                f"{requested}: cannot list its site-packages {site}: {exc.strerror or exc}",
                hint="run as a user who can read the whole environment, or fix the folder's "
                "permissions",
            ) from exc
        for name in sorted(names):
            if name.endswith(".dist-info") and os.path.isdir(os.path.join(site, name)):
                out.append(read_dist(site, name))
    return out


def wheel_tags(dist_info: Path) -> frozenset[Tag] | None:
    """The tags of the wheel a distribution was installed from (its WHEEL file's ``Tag`` lines);
    None when it has no WHEEL or a tag that does not parse."""
    try:
        headers = HeaderParser().parsestr((dist_info / "WHEEL").read_text(errors="replace"))
    except OSError:
        return None
    found: set[Tag] = set()
    for value in headers.get_all("Tag") or []:
        try:
            found |= parse_tag(value.strip())
        except ValueError:
            return None
    return frozenset(found) or None


def chosen_wheel(candidates: Sequence[tuple[str, str]], tags: frozenset[Tag] | None) -> str | None:
    """Of ``(file name, sha256)`` candidates, the sha256 of the one wheel whose file name has
    exactly the installed WHEEL's ``tags`` (None: none, or several with other bytes)."""
    if tags is None:
        return None
    match = []
    for filename, sha in candidates:
        try:
            _name, _ver, _build, file_tags = parse_wheel_filename(filename)
        except InvalidWheelFilename:
            continue
        if file_tags == tags:
            match.append(sha)
    return match[0] if len(set(match)) == 1 and match[0] else None
