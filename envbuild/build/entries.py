"""Layer entries: the members of a layer as values, before any tar byte is written.

An :class:`Entry` is a path (relative, POSIX), a :class:`Kind`, a mode and owner, and for a file
its size and where its bytes come from. :func:`tree_entries` makes them from a directory tree
(uid/gid 0; modes 0755 for directories and executables, else 0644, whatever the umask;
hardlinked files as hardlinks; device files, fifos and sockets refused); :func:`whiteout` and
:func:`opaque` delete what a lower layer had. :func:`arrange` puts any entries into the order
the tar writer (:mod:`envbuild.build.tarwrite`) needs: paths normalized, duplicates refused,
missing parent directories added (0755), sorted bytewise (a directory before its contents),
the first path of each hardlink group holding the content.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import IO

from envbuild.errors import InputFileError, LayerError

log = logging.getLogger(__name__)

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


class Kind(StrEnum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"
    HARDLINK = "hardlink"


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
