"""A Python environment as it really is: its interpreter, every distribution, and every file
checked against the RECORD its installer wrote.

The interpreter is asked only where its site-packages are (``python -I -S``, a few lines: no
``site``, so nothing of the inspected environment runs); the distributions
(:mod:`envbuild.snapshot.distinfo`) and their files are read here, so any Python (3.8 up) can be
inspected without envbuild installed in it.

Integrity, per distribution: *modified* (sha256 or size differs from RECORD), *missing*,
*unrecorded* (a file inside a folder the distribution owns that no RECORD lists). Paths listed by
two distributions are *overlaps*; the owner whose bytes are on disk is named. Compiled bytecode
(``__pycache__``) is skipped: interpreters rewrite it at will.

``full`` hashes every file; ``quick`` stats every file (missing, size) and hashes only those
whose mtime is newer than their distribution's RECORD, i.e. written after the install. The
check runs in parallel workers (:mod:`envbuild.snapshot.records`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from envbuild.errors import EnvironmentFailure, InputFileError, ToolFailed, UnreadableFiles
from envbuild.installed.hashing import hash_one, stat_one
from envbuild.proc import core as proc
from envbuild.snapshot import contents, records
from envbuild.snapshot.distinfo import describe, find_dists
from envbuild.snapshot.model.pyenv import AddedFile, Distribution, FileModes, Overlap, PythonEnv
from envbuild.snapshot.records import FOUND, Dist, Merged, Mode

log = logging.getLogger(__name__)

#: Run with ``-I -S -B``: no ``site`` (so no ``.pth`` file of the inspected environment runs),
#: no bytecode written. Without ``site`` a venv's ``sys.prefix`` is still the base install's
#: (``site.venv`` is what moves it, CPython 3.8 to 3.13), so the venv is found here as ``site``
#: finds it (``pyvenv.cfg`` beside the executable or one folder up) and its site-packages are
#: computed for that prefix.
_PROBE = """\
import json, os, platform, sys, sysconfig
exe_dir = os.path.dirname(os.path.abspath(sys.executable))
venv = os.path.dirname(exe_dir)
if any(os.path.isfile(os.path.join(d, "pyvenv.cfg")) for d in (exe_dir, venv)):
    names = sysconfig.get_scheme_names()
    scheme = "venv" if "venv" in names else ("nt" if os.name == "nt" else "posix_prefix")
    where = {"base": venv, "platbase": venv}
    prefix = venv
    site = [sysconfig.get_path(k, scheme, where) for k in ("purelib", "platlib")]
else:
    prefix = sys.prefix
    site = [sysconfig.get_path(k) for k in ("purelib", "platlib")]
print(json.dumps({"version": platform.python_version(),
    "implementation": sys.implementation.name, "executable": sys.executable,
    "prefix": prefix, "site": sorted(set(site))}))
"""


@dataclass(frozen=True)
class Interpreter:
    """What the interpreter said about itself: version, prefix and its site-packages."""

    requested: str
    executable: str
    prefix: str
    version: str
    implementation: str
    site_packages: list[str]


def probe(python: str) -> Interpreter:
    """Ask ``python`` where it keeps its packages. A folder means its ``bin/python``."""
    path = Path(python)
    if path.is_dir():
        found = [path / "bin" / n for n in ("python", "python3") if (path / "bin" / n).exists()]
        path = found[0] if found else path / "bin" / "python"
    if not os.path.lexists(path):
        raise InputFileError(python, "no such interpreter", hint="pass a python binary or a venv")
    hint = "pass the path of a Python interpreter (or of a virtual environment)"
    try:
        done = proc.run(
            [path, "-I", "-S", "-B", "-c", _PROBE],
            tool=str(python),
            env=proc.child_env(),
            timeout=60,
        )
    except (ToolFailed, EnvironmentFailure) as exc:
        raise InputFileError(python, f"is not a working Python ({exc.message})", hint=hint) from exc
    except OSError as exc:
        raise InputFileError(python, f"cannot run it: {exc.strerror or exc}", hint=hint) from exc
    try:
        info = json.loads(done.stdout.strip().splitlines()[-1])
        return Interpreter(
            requested=python,
            executable=str(info["executable"]),
            prefix=str(info["prefix"]),
            version=str(info["version"]),
            implementation=str(info["implementation"]),
            site_packages=[str(p) for p in info["site"] if os.path.isdir(p)],
        )
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise InputFileError(python, "is not a Python interpreter", hint=hint) from exc


def _unrecorded(
    dists: list[Dist], found: dict[str, list[str]], merged: Merged, mode: Mode = "full"
) -> tuple[list[str], list[AddedFile]]:
    """Give each file ``found`` in site-packages that no RECORD lists to the one distribution
    owning its folder. Returns the files no single distribution owns, and every unlisted file
    with its size and digest (so that a later edit of it is seen; the quick check hashes those
    up to :data:`QUICK_HASH_LIMIT` bytes)."""
    recorded = merged.recorded
    owners = merged.folder_owners
    for number, dist in enumerate(dists):
        recorded.add(os.path.join(dist.site, dist.dist_info, "RECORD"))
        owners.setdefault(os.path.join(dist.site, dist.dist_info), set()).add(number)
    unowned: list[str] = []
    added: list[AddedFile] = []
    for site, paths in found.items():
        cut = len(site) + 1 if os.path.abspath(site) == site else 0
        for path in paths:
            if path in recorded:
                continue
            shown = path[cut:] if cut else os.path.relpath(path, site)
            who = _owners_of(path, site, owners)
            owner = next(iter(who)) if len(who) == 1 else None
            if owner is None:
                unowned.append(shown)
            else:
                dists[owner].unrecorded.append(shown)
            fh = stat_one(path)
            if fh.error is None and (mode == "full" or fh.size <= QUICK_HASH_LIMIT):
                fh = hash_one(path)
            added.append(
                AddedFile(
                    path=shown,
                    distribution=dists[owner].name if owner is not None else None,
                    folder_owners=sorted({dists[n].name for n in who}) if owner is None else [],
                    size=fh.size,
                    sha256=fh.digest.hex() if fh.digest is not None else None,
                    mode=_octal(fh.mode) if fh.error is None else None,
                )
            )
    return sorted(unowned), sorted(added, key=lambda a: a.path)


#: The quick check hashes files no RECORD lists up to this size (a later same-size edit of a
#: bigger one is seen by the full check only).
QUICK_HASH_LIMIT = 16 << 20


def _files_under(top: str, unlistable: list[tuple[str, str]]) -> Iterator[str]:
    """Every non-directory below ``top`` (as ``os.walk`` finds them: links to directories are
    neither followed nor listed), not inside __pycache__. A folder that cannot be listed goes to
    ``unlistable`` with the reason: a file dropped into it would not be seen."""
    stack = [top]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as it:
                children = list(it)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR):  # not gone since its parent
                unlistable.append((folder, exc.strerror or str(exc)))
            continue
        for child in children:
            try:
                is_dir = child.is_dir()
            except OSError:
                is_dir = False
            if not is_dir:
                yield child.path
            elif child.name != "__pycache__" and not child.is_symlink():
                stack.append(child.path)


def _owners_of(path: str, site: str, dir_owner: dict[str, set[int]]) -> set[int]:
    """The distributions owning the nearest folder above ``path`` that any owns (none: empty)."""
    inside = site + os.sep
    parent = path.rpartition(os.sep)[0]
    while parent.startswith(inside):
        who = dir_owner.get(parent)
        if who:
            return who
        parent = parent.rpartition(os.sep)[0]
    return set()


def scan_env(python: str, mode: Mode = "full") -> PythonEnv:
    interp = probe(python)
    return scan_site_packages(interp, mode)


def scan_site_packages(interp: Interpreter, mode: Mode = "full") -> PythonEnv:
    start = time.perf_counter()
    dists = find_dists(interp.requested, interp.site_packages)
    found: dict[str, list[str]] = {}
    unlistable: list[tuple[str, str]] = []

    def meanwhile() -> None:  # while the workers check the recorded files
        for dist in dists:
            describe(dist)
        for site in interp.site_packages:
            found[site] = list(_files_under(site, unlistable))

    read = time.perf_counter()
    merged = records.merge(dists, records.check(dists, mode, meanwhile=meanwhile))
    checked_at = time.perf_counter()
    unowned, added = _unrecorded(dists, found, merged, mode)
    unlisted = {a.path: a.sha256 for a in added}
    listed = {id(d): records.digests(d) for d in dists if d.record is not None}
    shared = _shared_on_disk(dists, merged.overlaps, listed)
    # a metadata file RECORD lists is found by both looks: named once
    unreadable = [f"{path} ({d.name}): {why}" for d in dists for path, why in d.unreadable]
    unreadable = list(dict.fromkeys(unreadable + merged.unreadable))
    unreadable += [f"{folder}: cannot list it: {why}" for folder, why in unlistable]
    if unreadable:
        shown = "; ".join(unreadable[:3]) + (
            f" (and {len(unreadable) - 3} more)" if len(unreadable) > 3 else ""
        )
        raise UnreadableFiles(
            f"{interp.requested}: cannot check every file: {shown}",
            hint="run as a user who can read the whole environment, or repair those files",
        )
    checked = sum(d.files for d in dists)
    log.debug(
        "read RECORDs %.2f s, checked and walked %.2f s, unrecorded files %.2f s",
        read - start, checked_at - read, time.perf_counter() - checked_at,
    )  # fmt: skip
    log.info(
        "%s: %d distributions, %d files checked (%s) in %.2f s",
        interp.requested,
        len(dists),
        checked,
        mode,
        time.perf_counter() - start,
    )
    return PythonEnv(
        requested=interp.requested,
        executable=interp.executable,
        prefix=interp.prefix,
        version=interp.version,
        implementation=interp.implementation,
        site_packages=interp.site_packages,
        integrity=mode,
        distributions=sorted(
            (_to_model(d, unlisted, listed.get(id(d)), shared) for d in dists),
            key=lambda d: (d.name, d.version),
        ),
        overlaps=merged.overlaps,
        unowned=unowned,
        added=added,
    )


def _shared_on_disk(
    dists: list[Dist], overlaps: list[Overlap], listed: dict[int, list[tuple[str, str | None]]]
) -> dict[str, str | None]:
    """The bytes on disk of each path several distributions list, as RECORD writes a digest:
    the line of an owner it matches (the last installed one's, usually), whichever owner's
    contents it is counted in. One that matches none is each owner's modified file (its
    digest is there), so it is not in this table."""
    by_name: dict[str, list[Dist]] = {}
    for d in dists:
        by_name.setdefault(d.name, []).append(d)
    wanted: dict[str, str] = {}  # path -> the name of an owner whose line it matches
    for o in overlaps:
        if o.matches:
            wanted[o.path] = o.matches[0]
    out: dict[str, str | None] = {}
    for name in sorted(set(wanted.values())):
        for d in by_name.get(name, []):
            for path, digest in listed.get(id(d), []):
                if wanted.get(path) == name:
                    out.setdefault(path, digest)
    return out


def _to_model(
    d: Dist,
    unlisted: dict[str, str | None],
    listed: list[tuple[str, str | None]] | None,
    shared: dict[str, str | None],
) -> Distribution:
    """The distribution as the snapshot keeps it; ``unlisted``: every file no RECORD lists, by
    path, and its hex sha256; ``listed``: its RECORD's (path, digest) lines; ``shared``: the
    bytes on disk of the paths several distributions list (:func:`_shared_on_disk`): counted in
    every owner's contents as the bytes there, so that an edit of one is an edit of each."""
    digest = None
    if listed is not None:
        digest = contents.files_sha256(
            d.dist_info,
            [(path, shared.get(path, sha)) for path, sha in listed],
            {m.path: m.sha256 for m in d.modified},
            set(d.missing),
            {path: unlisted.get(path) for path in d.unrecorded},
        )
    return Distribution(
        name=d.name,
        version=d.version,
        installer=d.installer,
        dist_info=d.dist_info,
        record_sha256=d.record_sha256,
        files=d.files,
        size_bytes=d.size,
        modified=sorted(d.modified, key=lambda m: m.path),
        missing=sorted(d.missing),
        unrecorded=sorted(d.unrecorded),
        modes=_modes(d),
        files_sha256=digest,
    )


def _octal(mode: int) -> str:
    return f"{mode:04o}"


def _modes(d: Dist) -> FileModes | None:
    """The files' modes as the manifest keeps them: the most common one (a tie: the lowest, so
    that two looks at one environment agree), and the files with another. Counted per job in C
    (``Counter`` of an array): most jobs hold one mode only, and their paths are never looked at."""
    counts: Counter[int] = Counter()
    for _, modes in d.modes:
        counts.update(modes)
    counts.pop(0, None)  # not found
    if not counts:
        return None
    usual = max(counts, key=lambda mode: (counts[mode], -mode))
    inside = d.site + os.sep
    found: dict[int, set[str]] = {}
    for paths, modes in d.modes:
        if modes.count(usual) + modes.count(0) == len(modes):
            continue
        for path, mode in zip(paths, modes, strict=True):
            if mode and mode != usual:
                rel = path[len(inside) :] if path.startswith(inside) else None
                found.setdefault(mode, set()).add(rel or os.path.relpath(path, d.site))
    other = {_octal(mode & ~FOUND): sorted(found[mode]) for mode in sorted(found)}
    return FileModes(usual=_octal(usual & ~FOUND), other=other)
