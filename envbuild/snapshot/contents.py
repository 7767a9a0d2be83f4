"""What a distribution's files are, as one digest: the identity two environments are compared by.

A distribution's *contents* are its files as they are on disk, by path relative to
site-packages: for each file its RECORD lists, the RECORD's sha256 when the file matches it and
the disk's when it was modified (missing files left out), and each file no RECORD lists that
the distribution owns (unrecorded). :func:`files_sha256` hashes that table, so two
environments whose distribution holds the same bytes at the same paths agree on it whatever
their RECORDs say: a venv edited by hand and a generation whose declared patch made the same
edit have the same contents.

A path two distributions list is in each owner's contents with the bytes on disk (the snapshot
finds which owner's line they match): an edit of it changes both owners' contents.

Left out, because installers and envbuild's patch step write them, not the distribution: the
installer files of its ``.dist-info`` (:data:`INSTALLER_FILES`), ``METADATA`` (it holds the
version, compared as the version) and ``envbuild-patches.json`` (compared as the patches),
bytecode, and every file outside site-packages (entry-point scripts get the interpreter's
path). A file line of a path left out (:func:`counted`) is compared on its own, as before.
The ``.dist-info`` folder is named without its version, so a patched wheel's renamed folder holds
the same paths.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping

from envbuild.fsio import record_digest
from envbuild.sourcebuild.patches import PATCHES_FILE

log = logging.getLogger(__name__)

#: Files of a .dist-info that installers write (or rewrite) themselves.
INSTALLER_FILES = frozenset(
    {
        "INSTALLER",
        "REQUESTED",
        "direct_url.json",
        "uv_cache.json",  # uv: where a wheel from --find-links or a build was cached
        "RECORD",
        "RECORD.jws",
        "RECORD.p7s",
    }
)
#: Files of a .dist-info envbuild's patch step rewrites or adds (compared another way).
_REWRITTEN = frozenset({"METADATA", PATCHES_FILE})


def content_key(path: str, dist_info: str) -> str | None:
    """The key of a site-packages path in a distribution's contents; None: left out."""
    if path.startswith("../") or path == ".." or os.path.isabs(path):
        return None
    parts = path.split("/")
    if "__pycache__" in parts:
        return None
    if parts[0] == dist_info:
        if len(parts) == 2 and (parts[1] in INSTALLER_FILES or parts[1] in _REWRITTEN):
            return None
        return "/".join([".dist-info", *parts[1:]])
    return path


def counted(path: str) -> bool:
    """Whether a site-packages path is in its distribution's contents (whichever distribution's
    ``.dist-info`` it is in)."""
    head = path.split("/", 1)[0]
    return content_key(path, head if head.endswith(".dist-info") else "") is not None


def files_sha256(
    dist_info: str,
    entries: list[tuple[str, str | None]],
    modified: Mapping[str, str | None],
    missing: set[str],
    unrecorded: Mapping[str, str | None],
) -> str | None:
    """The sha256 of a distribution's contents. ``entries``: its RECORD's (path, sha256 as
    RECORD writes it); ``modified`` and ``unrecorded``: path → hex sha256 on disk. None when
    a file's digest is not known (a RECORD line without one, a file too big for the quick
    check): then its contents cannot be compared."""
    table: dict[str, str] = {}
    for path, digest in entries:
        key = content_key(path, dist_info)
        if key is None or path in missing:
            continue
        if path in modified:
            on_disk = modified[path]
            if on_disk is None:
                return None
            digest = record_digest(bytes.fromhex(on_disk))
        if digest is None:
            return None
        table[key] = digest
    for path, hexdigest in unrecorded.items():
        key = content_key(path, dist_info)
        if key is None:
            continue
        if hexdigest is None:
            return None
        table[key] = record_digest(bytes.fromhex(hexdigest))
    h = hashlib.sha256()
    for key in sorted(table):
        h.update(f"{key}\0{table[key]}\n".encode())
    return h.hexdigest()
