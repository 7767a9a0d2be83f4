"""The link check of an image before it exists: its wheels and its base's layers.

A build never has the whole environment on disk at once (each layer is installed into its own
staging root and packed), but every path a wheel installs is known from the wheel
(:func:`envbuild.installed.wheelpaths.member_path`), and every path of the base from its layers' tar
listings. So the check reads the wheels' ELF members — inflated in memory
(:mod:`.zipread`) and parsed in the worker pool, only when the cache does not know them; nothing
is written to disk but a member that is not a readable ELF file — and the names in the base's
library folders, listed meanwhile.

A member's facts are cached under a key of its wheel's sha256 and its name when the wheel's
sha256 is known (the lock's, checked when the wheel was fetched: it fixes every member's bytes,
so the ~8 GB of kimi-nvfp4's ELF members are not hashed again); a wheel without one has each
member hashed, and its facts cached by that sha256 (looked up first by its RECORD's).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import posixpath
import stat
import tarfile
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbuild.errors import InputFileError
from envbuild.installed.venv import VenvTarget
from envbuild.installed.wheelpaths import member_path
from envbuild.linkcheck.core import SYSTEM_DIRS, Report, check_entries
from envbuild.linkcheck.facts import ElfInfo
from envbuild.linkcheck.reader import Cache
from envbuild.oci.compression import open_uncompressed

#: Listing a base layer stops after this many members (a bound on a hostile layer).
MAX_MEMBERS = 2_000_000

#: Bumped whenever what a cached wheel map or base listing holds, or how it is made, changes.
MAP_FORMAT = 1

#: Bumped whenever how a member's bytes are taken out of its wheel changes (its facts' key).
MEMBER_FORMAT = 1


@dataclass(frozen=True)
class Wheel:
    dist: str
    version: str
    path: Path
    #: The wheel's sha256 (the lock's): its member map is then cached.
    sha256: str | None = None


def _digest(record_hash: str) -> str | None:
    """The hex sha256 of a RECORD hash field (``sha256=<urlsafe base64>``)."""
    algo, _, value = record_hash.partition("=")
    if algo != "sha256" or not value:
        return None
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except ValueError:
        return None
    return raw.hex() if len(raw) == 32 else None


def _maybe_elf(name: str, mode: int) -> bool:
    leaf = posixpath.basename(name)
    return ".so" in leaf or bool(mode & 0o111 and not leaf.endswith(".py"))


def _records(zf: zipfile.ZipFile) -> dict[str, str]:
    import csv
    import io

    record = next(
        (n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/RECORD")), None
    )
    if record is None:
        return {}
    rows = csv.reader(io.StringIO(zf.read(record).decode("utf-8", "replace")))
    return {row[0]: row[1] for row in rows if len(row) > 1}


def _key(*parts: object) -> str:
    return hashlib.sha256(json.dumps([MAP_FORMAT, *parts], sort_keys=True).encode()).hexdigest()


def member_key(wheel_sha256: str, member: str) -> str:
    """The cache key of a member of the wheel whose sha256 is ``wheel_sha256``: a digest of
    those two names (and of how a member is read), never of the member's bytes."""
    return _key("member", MEMBER_FORMAT, wheel_sha256, member)


def map_key(wheel_sha256: str, target: VenvTarget, leave: frozenset[str]) -> str:
    """The cache key of the member map of the wheel whose sha256 is ``wheel_sha256``, installed
    for ``target`` without the paths in ``leave``."""
    return _key(wheel_sha256, target.key(), sorted(leave))


def wheel_members(
    zf: zipfile.ZipFile, target: VenvTarget, leave: frozenset[str], records: bool = True
) -> list[tuple[str, str, str | None, bool]]:
    """A wheel's installed members in its order: (path in the image, member, RECORD sha256
    (None without ``records``), may be ELF)."""
    hashes = _records(zf) if records else {}
    out: list[tuple[str, str, str | None, bool]] = []
    venv = target.venv.rstrip("/")
    for info in zf.infolist():
        if info.is_dir():
            continue
        rel = member_path(info.filename, target)
        if rel is None or rel in leave:
            continue
        env = posixpath.normpath(f"{venv}/{rel}")
        if not env.startswith(venv + "/"):
            continue  # a member that climbs out: install refuses it anyway
        mode = info.external_attr >> 16
        elf = _maybe_elf(info.filename, mode) and not stat.S_ISLNK(mode)
        digest = _digest(hashes.get(info.filename, "")) if elf else None
        out.append((env, info.filename, digest, elf))
    return out


def _cached_members(body: object) -> list[tuple[str, str, str | None, bool]] | None:
    if not isinstance(body, list):
        return None
    out = []
    for row in body:
        if not (isinstance(row, list) and len(row) == 4):
            return None
        env, member, digest, elf = row
        if not (isinstance(env, str) and isinstance(member, str) and isinstance(elf, bool)):
            return None
        if digest is not None and not isinstance(digest, str):
            return None
        out.append((env, member, digest, elf))
    return out


def wheel_entries(
    wheels: Iterable[Wheel],
    target: VenvTarget,
    work: Path,
    cache: Cache,
    leaves: Mapping[str, frozenset[str]] | None = None,
    meanwhile: Callable[[], object] | None = None,
) -> tuple[dict[str, tuple[str | None, str | None]], set[str], dict[str, tuple[str, str]]]:
    """The entries for :func:`~envbuild.linkcheck.core.check_entries`: each wheel's members that may
    be ELF, by their path in the image (each with its cache key); the others' paths; and the
    owners. ``leaves`` are the paths (relative to the venv) a distribution's layer leaves out
    (it lost an overlap). A wheel whose sha256 is known has its member map kept in ``cache``
    under that sha256, the target and its leaves: a later check opens only the wheels with ELF
    members to read. ``meanwhile`` runs in this process while the members are read."""
    entries: dict[str, tuple[str | None, str | None]] = {}
    names: set[str] = set()
    owners: dict[str, tuple[str, str]] = {}
    pending: dict[str, tuple[Wheel, str]] = {}  # what to take out: the last wheel's member
    sizes: dict[Path, dict[str, int]] = {}  # of the ELF members of the wheels opened here
    for wheel in wheels:
        leave = (leaves or {}).get(wheel.dist, frozenset())
        key = map_key(wheel.sha256, target, leave) if wheel.sha256 else None
        members = _cached_members(cache.get_doc("wheels", key)) if key else None
        if members is None:
            try:
                with zipfile.ZipFile(wheel.path) as zf:
                    # a wheel's sha256 names its members' facts: its RECORD is not asked
                    members = wheel_members(zf, target, leave, records=not wheel.sha256)
                    sizes[wheel.path] = {m: zf.getinfo(m).file_size for _, m, _, e in members if e}
            except (OSError, zipfile.BadZipFile, KeyError) as exc:
                raise InputFileError(wheel.path.name, f"is not a readable wheel: {exc}") from None
            if key:
                cache.put_doc("wheels", key, [list(m) for m in members])
        for env, member, digest, elf in members:
            owners[env] = (wheel.dist, wheel.version)
            if not elf:
                names.add(env)
                continue
            if wheel.sha256:  # its bytes are fixed by the wheel's: no RECORD claim is needed
                digest = member_key(wheel.sha256, member)
            if digest is not None and cache.get(digest)[0]:
                entries[env] = (None, digest)
                pending.pop(env, None)
                continue
            pending[env] = (wheel, member)
    entries.update(_read_members(pending, work, cache, meanwhile, sizes))
    return entries, names, owners


#: The largest wheel member the check reads into memory (a hostile header cannot claim more).
MAX_MEMBER_BYTES = 8 << 30

#: Members of one wheel are read in jobs of about this many bytes (each job opens the wheel
#: once; the biggest members are jobs of their own).
JOB_BYTES = 256 << 20

#: (wheel path, its members, each one's cache key (None: its sha256, to compute: the wheel's
#: is not known), the cache's folder to write their facts in (None: none), whether it runs in a
#: forked worker process).
_Job = tuple[str, tuple[str, ...], tuple[str | None, ...], str | None, bool]
_Result = tuple[str, dict[str, Any] | None, list[str], str | None, bytes | None]


def _read_job(job: _Job, _buffer: bytearray | None) -> list[_Result]:
    """In a worker: for each member of one wheel, (its cache key, ELF facts, exports, error,
    the bytes when they are not a readable ELF file: they are then written out for the
    report). The facts are put in the cache here, beside the other workers, not after them."""
    from envbuild.linkcheck.elf import BadElf, is_elf, read_elf
    from envbuild.linkcheck.zipread import keep_heap, read_member

    path, members, keys, root, forked = job
    if forked:  # a worker process, which exits when the jobs are done
        keep_heap()
    cache = Cache(Path(root) if root is not None else None)
    out: list[_Result] = []
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed with the zip below)
        zf = zipfile.ZipFile(f)
    except (OSError, zipfile.BadZipFile) as exc:
        return [("", None, [], f"wheel: {exc}", None)]
    with f, zf:
        for member, key in zip(members, keys, strict=True):
            try:
                data = read_member(f, zf, zf.getinfo(member), MAX_MEMBER_BYTES)
            except (OSError, zipfile.BadZipFile, KeyError, EOFError) as exc:
                return [("", None, [], f"wheel: {exc}", None)]
            key = key or hashlib.sha256(data).hexdigest()
            try:
                info = read_elf(io.BytesIO(data)) if is_elf(data[:4]) else None
            except BadElf:
                out.append((key, None, [], "bad", data))
                continue
            cache.put(key, info)
            if info is None:
                out.append((key, None, [], None, None))
            else:
                out.append((key, info.as_dict(), sorted(info.exports), None, None))
    return out


def _jobs(
    pending: Mapping[str, tuple[Wheel, str]], sizes: Mapping[Path, Mapping[str, int]]
) -> list[tuple[int, _Job, list[str]]]:
    """The pending members as (bytes, job, the image paths it reads), costliest first;
    ``sizes``: the members' sizes where their wheel has been opened already."""
    by_wheel: dict[Path, list[tuple[str, str, str | None]]] = {}
    for env, (wheel, member) in pending.items():
        key = member_key(wheel.sha256, member) if wheel.sha256 else None
        by_wheel.setdefault(wheel.path, []).append((env, member, key))
    jobs: list[tuple[int, _Job, list[str]]] = []
    for path, members in by_wheel.items():
        known = sizes.get(path, {})
        try:
            if all(m in known for _, m, _ in members):
                sized = [(known[m], m, env, key) for env, m, key in members]
            else:
                with zipfile.ZipFile(path) as zf:
                    sized = [(zf.getinfo(m).file_size, m, env, key) for env, m, key in members]
        except (OSError, zipfile.BadZipFile, KeyError) as exc:
            raise InputFileError(path.name, f"is not a readable wheel: {exc}") from None
        sized.sort(reverse=True)
        while sized:
            take = 1
            while take < len(sized) and sum(x[0] for x in sized[: take + 1]) <= JOB_BYTES:
                take += 1
            batch, sized = sized[:take], sized[take:]
            job = (str(path), tuple(x[1] for x in batch), tuple(x[3] for x in batch), None, False)
            jobs.append((sum(x[0] for x in batch), job, [x[2] for x in batch]))
    jobs.sort(key=lambda j: -j[0])
    return jobs


def _read_members(
    pending: Mapping[str, tuple[Wheel, str]],
    work: Path,
    cache: Cache,
    meanwhile: Callable[[], object] | None = None,
    sizes: Mapping[Path, Mapping[str, int]] | None = None,
) -> dict[str, tuple[str | None, str | None]]:
    """Read each ``{path in the image: (wheel, member)}`` straight from its wheel (inflated in
    memory and parsed, in the worker pool, biggest first) into ``cache``: the entries then name
    it by its key (:func:`member_key`, or its sha256 when the wheel's is not known). A member
    that is not a readable ELF file is written under ``work`` for the check to report as it
    reports such a file on disk. ``meanwhile`` runs in this process while the workers read."""
    from envbuild.installed import hashing

    jobs = _jobs(pending, sizes or {})
    if not jobs:
        if meanwhile is not None:
            meanwhile()
        return {}
    total = sum(size for size, _, _ in jobs)
    workers = hashing.DEFAULT_WORKERS or os.cpu_count() or 1
    processes = workers > 1 and len(jobs) > 1 and hashing.forkable() and total >= 64 << 20
    root = str(cache.root) if cache.root is not None else None
    results = hashing.run_jobs(
        [(*job[:3], root, processes) for _, job, _ in jobs],
        _read_job,
        workers=workers,
        processes=processes,
        meanwhile=meanwhile,
    )
    entries: dict[str, tuple[str | None, str | None]] = {}
    for (_, job, envs), rows in zip(jobs, results, strict=True):
        if rows and rows[0][3] is not None and rows[0][3].startswith("wheel: "):
            why = rows[0][3].removeprefix("wheel: ")
            raise InputFileError(Path(job[0]).name, f"is not a readable wheel: {why}")
        for env, (key, data, exports, error, raw) in zip(envs, rows, strict=True):
            if error is not None and raw is not None:
                here = work / env.lstrip("/")
                here.parent.mkdir(parents=True, exist_ok=True)
                here.write_bytes(raw)
                entries[env] = (str(here), None)
                continue
            # the worker has put it in the cache on disk; this run knows it from here
            cache.know(key, ElfInfo.from_dict(data, frozenset(exports)) if data else None)
            entries[env] = (None, key)
    return entries


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def base_system(
    layers: Sequence[tuple[Path, str]],
    *,
    cache: Cache | None = None,
    digests: Sequence[str] | None = None,
) -> tuple[list[str], frozenset[str]]:
    """:func:`_base_system`, kept in ``cache`` under the layers' ``digests`` (their content
    addresses in the store) when they are given: a later check decompresses no layer."""
    key = _key("base", list(digests), SYSTEM_DIRS, MAX_MEMBERS) if digests is not None else None
    if cache is not None and key is not None:
        body = cache.get_doc("base", key)
        if (
            isinstance(body, dict)
            and isinstance(dirs := body.get("dirs"), list)
            and isinstance(listing := body.get("listing"), list)
            and all(isinstance(x, str) for x in [*dirs, *listing])
        ):
            return dirs, frozenset(listing)
    dirs, listing = _base_system(layers)
    if cache is not None and key is not None:
        cache.put_doc("base", key, {"dirs": dirs, "listing": sorted(listing)})
    return dirs, listing


def _base_system(layers: Sequence[tuple[Path, str]]) -> tuple[list[str], frozenset[str]]:
    """The library folders of a base made of ``layers`` (blob path, media type; lowest first)
    and the paths in them, whiteouts applied; a folder that is a symlink (``/lib`` ->
    ``usr/lib`` in a merged-/usr Debian) shows the target's entries under its own name too."""
    present: set[str] = set()
    links: dict[str, str] = {}
    conf: list[str] = []
    count = 0
    for path, media_type in layers:
        with open_uncompressed(path, media_type) as stream:
            try:
                with tarfile.open(fileobj=stream, mode="r|") as tf:
                    for m in tf:
                        count += 1
                        if count > MAX_MEMBERS:
                            raise InputFileError(path.name, "has too many members for a base layer")
                        name = "/" + posixpath.normpath(m.name.lstrip("./") or ".").lstrip("/")
                        leaf = posixpath.basename(name)
                        parent = posixpath.dirname(name)
                        if leaf == ".wh..wh..opq":  # an opaque folder: the lower layers' go
                            present.difference_update(
                                {p for p in present if p.startswith(parent + "/")}
                            )
                            continue
                        if leaf.startswith(".wh."):
                            gone = posixpath.join(parent, leaf[4:])
                            present.discard(gone)
                            present.difference_update(
                                {p for p in present if p.startswith(gone + "/")}
                            )
                            continue
                        if m.issym() and name.count("/") == 1:
                            links[name] = posixpath.normpath(posixpath.join("/", m.linkname))
                        if parent.startswith("/etc/ld.so.conf") and m.isfile() and m.size < 65536:
                            f = tf.extractfile(m)
                            if f is not None:
                                conf += [
                                    line.split("#", 1)[0].strip()
                                    for line in f.read().decode("utf-8", "replace").splitlines()
                                ]
                        present.add(name)
            except tarfile.TarError as exc:
                raise InputFileError(path.name, f"is not a readable layer: {exc}") from None
    for alias, real in links.items():
        present.update(alias + p[len(real) :] for p in list(present) if p.startswith(real + "/"))
    dirs = list(dict.fromkeys([*(c for c in conf if c.startswith("/")), *SYSTEM_DIRS]))
    listing = frozenset(p for p in present if posixpath.dirname(p) in dirs)
    return dirs, listing


def check_image(
    wheels: Sequence[Wheel],
    base_layers: Sequence[tuple[Path, str]],
    target: VenvTarget,
    work: Path,
    *,
    cache: Cache,
    torch: str | None = None,
    leaves: Mapping[str, frozenset[str]] | None = None,
    base_digests: Sequence[str] | None = None,
) -> Report:
    """The link check of the image the build makes (nothing accepted: the spec's rules apply
    to the report). ``base_digests``: the base layers' digests, to cache their listing by. The
    base is listed while the workers read the wheels' members."""
    system: list[tuple[list[str], frozenset[str]]] = []

    def list_base() -> None:
        system.append(base_system(base_layers, cache=cache, digests=base_digests))

    entries, names, owners = wheel_entries(wheels, target, work, cache, leaves, meanwhile=list_base)
    return check_entries(
        entries,
        names=frozenset(names),
        owners=owners,
        system=system[0],
        torch=torch,
        cache=cache,
    )
