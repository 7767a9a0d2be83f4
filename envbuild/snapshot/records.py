"""Every file of an environment checked against its distribution's RECORD, in parallel.

The one process that reads the RECORDs is the part of a check that does not scale, so it does
as little as it can: it reads each RECORD's text, finds the big files in it with one regular
expression (their sha256 is the critical path: one file's hash is sequential), and cuts the
rest into chunks of lines. Workers (forked processes for big checks, see :mod:`hashing`) take
the big files first, largest first, then the chunks; a worker parses its chunk, looks at each
file and judges it against its line itself, and returns only what the parent needs: the paths
(for overlaps and the unrecorded-file walk), the folders they sit in, the total size, and what
was wrong. :func:`merge` then resolves paths two distributions list: the owner whose line the
file matches is named, and the others are not told it was modified.
"""

from __future__ import annotations

import csv
import io
import logging
import os
import re
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from envbuild.fsio import record_digest
from envbuild.installed import hashing
from envbuild.installed.hashing import BIG, hash_one, stat_one
from envbuild.snapshot.model.pyenv import ModifiedFile, Overlap

log = logging.getLogger(__name__)

Mode = Literal["full", "quick"]

#: Characters of RECORD text per chunk (about 600 lines).
CHUNK_CHARS = 64 << 10
#: What looking at one small file costs, in bytes of sha256 (open, read, close: ~25 µs); it
#: orders chunks among the big files.
FILE_COST = 32 << 10

#: Set in a checked file's mode in :class:`Checked` (a file of mode 0000 is found too).
FOUND = 0o10000

_BIG_TAIL = re.compile(r",(\d{7,})$", re.M | re.A)  # a line whose size field has 7+ digits


class Entry(NamedTuple):
    abs: str
    shown: str  # as RECORD names it, relative to site-packages
    sha256: str | None  # urlsafe base64, as RECORD writes it
    size: int | None


@dataclass
class Dist:
    """One ``.dist-info`` folder: what its metadata says, its RECORD's text, and once checked
    what was found."""

    name: str
    version: str
    installer: str | None
    site: str
    dist_info: str
    record_sha256: str | None = None
    record_mtime_ns: int = 0
    record: str | None = None  # the RECORD's text; None when there is none
    files: int = 0
    size: int = 0
    modified: list[ModifiedFile] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unrecorded: list[str] = field(default_factory=list)
    unreadable: list[tuple[str, str]] = field(default_factory=list)  # metadata: (path, why)
    #: each checked job's absolute paths and their modes (array "H": mode | FOUND; 0: not found)
    modes: list[tuple[list[str], array[int]]] = field(default_factory=list)

    @property
    def cuttable(self) -> bool:
        """Whether the RECORD can be cut into chunks and its big files found by
        :func:`plan`: every one but a quoted RECORD with carriage returns (rare: :func:`lines`
        turns the line ends of an unquoted one into newlines)."""
        return self.record is not None and "\r" not in self.record

    def entries(self) -> list[Entry]:
        """Every line of the RECORD as an entry (bytecode and empty lines left out)."""
        return _entries(self, rows(self.record or ""), skip_big=False)


def lines(raw: bytes) -> str:
    """A RECORD's text. One without quotes gets newlines for its line ends: csv reads each of
    CRLF, CR and LF as one, and only a quoted field can hold a CR of its own."""
    text = raw.decode("utf-8", errors="replace")
    if "\r" in text and '"' not in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def rows(text: str) -> list[list[str]]:
    """RECORD's CSV rows (empty lines dropped). A RECORD without quotes or carriage returns is
    split directly: the csv module gives the same fields (a path with a comma is quoted) at
    several times the cost, paid for every file."""
    if '"' in text or "\r" in text:
        return [row for row in csv.reader(io.StringIO(text)) if row]
    return [line.split(",") for line in text.split("\n") if line]


def _is_big(row: list[str]) -> bool:
    """A one-line entry whose file gets a job of its own (what :func:`_bigs` finds, exactly)."""
    return (
        len(row) == 3
        and len(row[2]) >= 7
        and row[2].isascii()
        and int(row[2]) >= BIG
        and "\n" not in row[0]
    )


def _skipped(rel: str) -> bool:
    return "__pycache__" in rel.replace("\\", "/").split("/")


def _entries(dist: Dist, rows: list[list[str]], *, skip_big: bool) -> list[Entry]:
    site = dist.site
    prefix = site + os.sep
    out: list[Entry] = []
    append = out.append
    for row in rows:
        rel = row[0]
        if not rel or ("__pycache__" in rel and _skipped(rel)) or (skip_big and _is_big(row)):
            continue
        if _odd(rel):
            abs_path, shown = _normal(rel, site)
        else:
            abs_path, shown = prefix + rel, rel
        n = len(row)
        hashed = row[1] if n > 1 else ""
        digest = hashed[7:].rstrip("=") or None if hashed.startswith("sha256=") else None
        size = int(row[2]) if n > 2 and row[2].isascii() and row[2].isdigit() else None
        append(Entry(abs_path, shown, digest, size))
    return out


def _odd(rel: str) -> bool:
    """A RECORD path that must be normalized (absolute, ``..``, ``.``, doubled or back slashes)."""
    return rel.startswith(("/", ".")) or "/." in rel or "//" in rel or "\\" in rel


def _normal(rel: str, site: str) -> tuple[str, str]:
    abs_path = os.path.normpath(rel if os.path.isabs(rel) else os.path.join(site, rel))
    return abs_path, os.path.relpath(abs_path, site)


def digests(dist: Dist) -> list[tuple[str, str | None]]:
    """Each RECORD line's path as :class:`Entry` shows it and its sha256 as RECORD writes it
    (what :func:`envbuild.snapshot.contents.files_sha256` takes; bytecode left out), without
    making an entry of each line."""
    out: list[tuple[str, str | None]] = []
    append = out.append
    for row in rows(dist.record or ""):
        rel = row[0]
        if not rel or ("__pycache__" in rel and _skipped(rel)):
            continue
        shown = _normal(rel, dist.site)[1] if _odd(rel) else rel
        hashed = row[1] if len(row) > 1 else ""
        append((shown, hashed[7:].rstrip("=") or None if hashed.startswith("sha256=") else None))
    return out


class Chunk(NamedTuple):
    """Lines ``start:end`` of distribution ``dist``'s RECORD, its big files left out when it
    is cuttable: they are :class:`Big` jobs."""

    dist: int
    start: int
    end: int
    lines: int

    @property
    def cost(self) -> int:
        return self.lines * FILE_COST


class Big(NamedTuple):
    dist: int
    entry: Entry

    @property
    def cost(self) -> int:
        return self.entry.size or 0


Job = Chunk | Big


def _bigs(dist: Dist) -> Iterator[Entry]:
    """The entries of a cuttable RECORD for which :func:`_is_big` holds, found by a regular
    expression instead of parsing every line. A line counts only if the quotes before it and
    within it are balanced: then it is one whole CSV record."""
    text = dist.record or ""
    quotes = '"' in text
    counted, odd = 0, False  # quotes seen up to ``counted``: is a quoted field open there?
    for match in _BIG_TAIL.finditer(text):
        start = text.rfind("\n", 0, match.start()) + 1
        line = text[start : match.end()]
        if quotes:
            odd ^= text.count('"', counted, start) % 2 == 1
            counted = start
            if odd or line.count('"') % 2:
                continue
            row = next(csv.reader([line]))
        else:
            row = line.split(",")
        if _is_big(row):
            yield from _entries(dist, [row], skip_big=False)


def _cuts(text: str) -> Iterator[tuple[int, int]]:
    """``text`` in pieces of about :data:`CHUNK_CHARS`, each ending at a line end outside any
    quoted field."""
    start, counted, odd = 0, 0, False
    while start < len(text):
        end = text.find("\n", start + CHUNK_CHARS)
        while end >= 0:
            odd ^= text.count('"', counted, end) % 2 == 1
            counted = end
            if not odd:
                break
            end = text.find("\n", end + 1)
        end = len(text) if end < 0 else end + 1
        yield start, end
        start = end


def plan(dists: Sequence[Dist]) -> list[Job]:
    """The jobs of a check, costliest first (longest-processing-time-first scheduling)."""
    jobs: list[Job] = []
    for number, dist in enumerate(dists):
        text = dist.record
        if not text:
            continue
        if not dist.cuttable:
            jobs.append(Chunk(number, 0, len(text), text.count("\n") + 1))
            continue
        jobs += [Big(number, entry) for entry in _bigs(dist)]
        for start, end in _cuts(text):
            jobs.append(Chunk(number, start, end, text.count("\n", start, end)))
    jobs.sort(key=lambda job: -job.cost)
    return jobs


class Checked(NamedTuple):
    """What a worker found for one job (cheap to pickle: no per-file objects but the paths)."""

    dist: int
    paths: str  # every entry's absolute path, NUL-separated, in RECORD order
    folders: list[str]  # the folders inside site-packages the entries are in
    files: int
    size: int  # of the files found
    modified: list[tuple[str, ModifiedFile]]  # (absolute path, what differs)
    missing: list[tuple[str, str]]  # (absolute path, as shown)
    unreadable: list[tuple[str, str]]  # (absolute path, why)
    unsure: list[str]  # found, but their line vouches for nothing (no hash, or no size)
    modes: bytes  # each entry's permission bits | FOUND (array "H", in RECORD order; 0: not found)


def check_job(
    job: Job, dists: Sequence[Dist], mode: Mode, buffer: bytearray | None = None
) -> Checked:
    """Look at each file of ``job`` and judge it against its RECORD line. ``full`` hashes
    every file; ``quick`` stats it and hashes it only when it was written after the RECORD."""
    dist = dists[job.dist]
    if isinstance(job, Big):
        entries = [job.entry]
    else:
        text = (dist.record or "")[job.start : job.end]
        entries = _entries(dist, rows(text), skip_big=dist.cuttable)
    buffer = buffer if buffer is not None else bytearray(BIG + 1)
    full = mode == "full"
    newer_than = dist.record_mtime_ns
    size = 0
    modified: list[tuple[str, ModifiedFile]] = []
    missing: list[tuple[str, str]] = []
    unreadable: list[tuple[str, str]] = []
    unsure: list[str] = []
    modes = array("H", bytes(2 * len(entries)))
    for number, e in enumerate(entries):
        fh = hash_one(e.abs, buffer) if full else stat_one(e.abs)
        if (
            not full
            and fh.error is None
            and e.sha256 is not None
            and (fh.mtime_ns > newer_than or (e.size is not None and fh.size != e.size))
        ):
            # written after the install (is it still the same?), or drifted: the full check's
            # digest is recorded, so that both checks record the same
            fh = hash_one(e.abs, buffer)
        if fh.error is not None:
            if not fh.missing:
                unreadable.append((e.abs, fh.error))
            elif os.path.islink(e.abs):
                unreadable.append((e.abs, "broken symbolic link"))
            else:
                missing.append((e.abs, e.shown))
            continue
        size += fh.size
        modes[number] = fh.mode | FOUND
        if e.size is not None and fh.size != e.size:  # first: what both checks see alike
            reason = "size"
        elif (
            fh.digest is not None and e.sha256 is not None and record_digest(fh.digest) != e.sha256
        ):
            reason = "sha256"
        else:
            if (e.sha256 if fh.digest is not None else e.size) is None:
                unsure.append(e.abs)
            continue
        modified.append(
            (e.abs, ModifiedFile(path=e.shown, reason=reason, expected_size=e.size,
                                 actual_size=fh.size,
                                 sha256=fh.digest.hex() if fh.digest is not None else None,
                                 written_after_record=fh.mtime_ns > newer_than))
        )  # fmt: skip
    return Checked(
        job.dist, "\0".join(e.abs for e in entries), _folders(entries, dist.site), len(entries),
        size, modified, missing, unreadable, unsure, modes.tobytes(),
    )  # fmt: skip


def _folders(entries: list[Entry], site: str) -> list[str]:
    inside = site + os.sep
    seen: set[str] = set()
    for e in entries:
        parent = e.abs.rpartition(os.sep)[0]  # paths here are absolute and normalized
        while parent not in seen and parent.startswith(inside):
            seen.add(parent)
            parent = parent.rpartition(os.sep)[0]
    return list(seen)


def check(
    dists: Sequence[Dist],
    mode: Mode,
    *,
    workers: int | None = None,
    meanwhile: Callable[[], object] | None = None,
) -> list[Checked]:
    """Check every recorded file of ``dists``; ``meanwhile`` runs here while workers do."""
    jobs = plan(dists)
    workers = workers or hashing.DEFAULT_WORKERS or os.cpu_count() or 1
    lines = sum(job.lines for job in jobs if isinstance(job, Chunk))
    work = sum(job.cost for job in jobs)
    processes = hashing.use_processes(workers, work, lines, stat_only=mode == "quick")
    return hashing.run_jobs(
        jobs,
        lambda job, buffer: check_job(job, dists, mode, buffer),
        workers=workers,
        processes=processes,
        meanwhile=meanwhile,
    )


@dataclass
class Merged:
    """The checked jobs put together: each distribution's findings are in its :class:`Dist`."""

    overlaps: list[Overlap]
    unreadable: list[str]  # "path (distribution): why"
    recorded: set[str]  # every path a RECORD lists
    folder_owners: dict[str, set[int]]  # folder -> the distributions with files in it


def merge(dists: Sequence[Dist], checked: Sequence[Checked]) -> Merged:
    """Fill in each distribution's findings. A path several distributions list holds the bytes
    of one of them (the last installed): the owners whose lines it matches are named in the
    overlap, and the others are not told it was modified, unless it matches none of them."""
    checked = sorted(checked, key=lambda c: c.dist)  # the first owner is the first listed
    first: dict[str, int] = {}
    shared: dict[str, list[int]] = {}
    folder_owners: dict[str, set[int]] = {}
    for c in checked:
        number = c.dist
        paths = c.paths.split("\0") if c.paths else []
        dists[number].modes.append((paths, array("H", c.modes)))
        for path in paths:
            owner = first.setdefault(path, number)
            if owner != number:
                who = shared.setdefault(path, [owner])
                if who[-1] != number:
                    who.append(number)
        for folder in c.folders:
            folder_owners.setdefault(folder, set()).add(number)
    doubtful: dict[str, set[int]] = {}  # shared path -> owners whose line it does not match
    if shared:
        for c in checked:
            for path in [p for p, _ in c.modified] + [p for p, _ in c.missing] + c.unsure:
                if path in shared:
                    doubtful.setdefault(path, set()).add(c.dist)
            for path, _ in c.unreadable:
                if path in shared:
                    doubtful[path] = set(shared[path])
    matches = {
        path: sorted({dists[n].name for n in who if n not in doubtful.get(path, ())})
        for path, who in shared.items()
    }
    unreadable: list[str] = []
    for c in checked:
        dist = dists[c.dist]
        dist.files += c.files
        dist.size += c.size
        dist.modified += [m for path, m in c.modified if not matches.get(path)]
        dist.missing += [shown for _, shown in c.missing]
        unreadable += [f"{path} ({dist.name}): {why}" for path, why in c.unreadable]
    overlaps = [
        Overlap(
            path=os.path.relpath(path, dists[who[0]].site),
            owners=sorted(dists[n].name for n in who),
            matches=matches[path],
        )
        for path, who in shared.items()
    ]
    return Merged(sorted(overlaps, key=lambda o: o.path), unreadable, set(first), folder_owners)
