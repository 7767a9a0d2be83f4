"""When two sides hold the same thing although their metadata differs: the comparison rules.

- A distribution is its name, its public version and its contents (its files as they are on
  disk, :mod:`envbuild.snapshot.contents`). ``X+envbuild.<key>`` is envbuild's mark of a
  patched wheel of ``X`` (:func:`~envbuild.sourcebuild.patches.unpatched_version`): a generation's
  ``six 1.16.0+envbuild.<key>`` whose files are a hand-edited ``six 1.16.0``'s files *is* that
  distribution. Its RECORD, its installer and its patches then differ by design, not in what is
  there.
- A read-only file's mode is the same as a writable one's with the same other bits: a
  generation is read-only by design (``tests/apply/test_shared.py`` compares trees without
  write bits). An executable bit still counts, and so do the write bits between two writable
  modes (a file made world-writable is named).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from envbuild.snapshot.diff.facts import Fact
from envbuild.sourcebuild.patches import unpatched_version

log = logging.getLogger(__name__)

_WRITE = 0o222
#: Subjects of a packages group that are no distribution.
NOT_DISTS = frozenset({"python", "torch build"})


def same_mode(a: str, b: str) -> bool:
    """Whether two octal modes are the same, a read-only file being the same as a writable
    one with the same other bits (``0444`` is ``0644``, ``0555`` is ``0755``). Between two
    writable modes the write bits count: ``0644 → 0666`` (made world-writable) is a change."""
    try:
        ma, mb = int(a, 8), int(b, 8)
    except ValueError:
        return a == b
    if ma == mb:
        return True
    read_only = not ma & _WRITE or not mb & _WRITE
    return read_only and ma & ~_WRITE == mb & ~_WRITE


@dataclass(frozen=True)
class Contents:
    """How one distribution's two sides compare; None where a side does not know its files."""

    name: str
    before: str  # the version on side a
    after: str
    same: bool
    same_record: bool  # the same RECORD digest on both sides


def contents(facts_a: dict[str, Fact], facts_b: dict[str, Fact]) -> dict[str, Contents]:
    """The distributions of two packages groups whose contents can be compared: the same name
    and public version on both sides, and both sides know their files' digest."""
    out: dict[str, Contents] = {}
    for name in sorted((facts_a.keys() & facts_b.keys()) - NOT_DISTS):
        da, db = facts_a[name].data or {}, facts_b[name].data or {}
        va, vb = str(da.get("version")), str(db.get("version"))
        ha, hb = da.get("files_sha256"), db.get("files_sha256")
        if ha is None or hb is None or unpatched_version(va) != unpatched_version(vb):
            continue
        ra, rb = da.get("record_sha256"), db.get("record_sha256")
        out[name] = Contents(name, va, vb, ha == hb, ra is not None and ra == rb)
    return out
