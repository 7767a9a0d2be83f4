"""The ELF facts of many files, read in parallel and cached by each file's sha256.

:func:`read_all` takes ``{path: digest or None}`` and returns ``{path: ElfInfo}`` for the ELF
files among them (plus the files it could not read, with the reason). A file's facts depend on
its bytes only, so they are kept under ``$XDG_CACHE_HOME/envbuild/linkcheck/`` by digest: a
wheel's files are read once per machine. (A wheel's members are kept under a key of the
wheel's sha256 and the member's name instead, :func:`envbuild.linkcheck.wheels.member_key`:
the "digest" of such an entry names the bytes, it is not their hash.) A digest the caller does
not know (a live venv) is
computed, and remembered with the file's size, mtime and inode, so an unchanged file is not
hashed again either. A cache entry that cannot be read (a crash while writing, a disk error, a
hand edit) is a miss: the file is read again and the entry rewritten.

The reading runs in the snapshot's worker pool (:func:`envbuild.installed.hashing.run_jobs`),
biggest files first.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbuild.errors import CacheDamaged
from envbuild.linkcheck.facts import ElfInfo

log = logging.getLogger(__name__)

#: Bumped whenever what an entry holds changes: older entries are then misses.
CACHE_FORMAT = 3


def default_cache() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(root) / "envbuild" / "linkcheck"


@dataclass
class Cache:
    """Entries ``v<format>/<digest[:2]>/<digest>.json`` under ``root`` (a digest: a file's
    sha256 or a wheel member's key); None: nothing kept on disk. Facts put in this run are
    known for the rest of it either way (a wheel's members are read before the check looks
    them up by digest)."""

    root: Path | None
    _known: dict[str, ElfInfo | None] = field(default_factory=dict, repr=False, compare=False)

    def _entry(self, digest: str, kind: str = "json") -> Path | None:
        if self.root is None:
            return None
        return self.root / f"v{CACHE_FORMAT}" / digest[:2] / f"{digest}.{kind}"

    def get(self, digest: str) -> tuple[bool, ElfInfo | None]:
        """(hit, the facts: None for a file that is not a host ELF object)."""
        if digest in self._known:
            return True, self._known[digest]
        entry = self._entry(digest)
        if entry is None:
            return False, None
        try:
            data = json.loads(entry.read_bytes())
            if data.get("digest") != digest:
                return False, None
            if data["info"] is None:
                return True, None
            exports = self._entry(digest, "exports")
            if exports is None or not exports.exists():
                return False, None
            return True, ElfInfo.from_dict(data["info"], lambda: self._exports(digest, exports))
        except (OSError, ValueError, KeyError, TypeError):
            return False, None

    def _exports(self, digest: str, path: Path) -> frozenset[str]:
        """An entry's exports: its first line is the digest, its last an end mark (a file cut
        short, or another file's, reads as an error: the check then cannot trust the entry)."""
        try:
            lines = path.read_bytes().decode().split("\n")
        except (OSError, UnicodeDecodeError) as exc:
            raise CacheDamaged(path, str(exc)) from exc
        if len(lines) < 3 or lines[0] != digest or lines[-2] != "end" or lines[-1]:
            raise CacheDamaged(path, "not a whole exports entry")
        return frozenset(lines[1:-2])

    def know(self, digest: str, info: ElfInfo | None) -> None:
        """Have this run know ``info`` under ``digest`` without writing it (another process
        has put it in the same folder)."""
        self._known[digest] = info

    def put(self, digest: str, info: ElfInfo | None) -> None:
        self._known[digest] = info
        entry = self._entry(digest)
        if entry is None:
            return
        if info is not None:  # the exports first: an entry is only used when both are there
            exports = self._entry(digest, "exports")
            assert exports is not None
            _write(exports, "\n".join([digest, *sorted(info.exports), "end", ""]).encode())
        data = {"digest": digest, "info": info.as_dict() if info is not None else None}
        _write(entry, json.dumps(data, separators=(",", ":")).encode())

    def get_doc(self, kind: str, key: str) -> Any | None:
        """A document put under ``kind``/``key`` (a listing, a path map), or None: absent, or
        damaged (not JSON, another key's, or its payload not matching the sha256 it states)."""
        if self.root is None:
            return None
        try:
            data = json.loads((self.root / f"v{CACHE_FORMAT}" / kind / f"{key}.json").read_bytes())
            body = data["data"]
            if data.get("key") != key or data.get("sha256") != _doc_digest(body):
                return None
            return body
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put_doc(self, kind: str, key: str, body: Any) -> None:
        if self.root is not None:
            doc = {"key": key, "sha256": _doc_digest(body), "data": body}
            path = self.root / f"v{CACHE_FORMAT}" / kind / f"{key}.json"
            _write(path, json.dumps(doc, separators=(",", ":")).encode())

    def stats(self, key: str) -> dict[str, list[Any]]:
        """The remembered ``{path: [size, mtime_ns, inode, digest]}`` of one tree."""
        if self.root is None:
            return {}
        try:
            data = json.loads((self.root / "stat" / f"{key}.json").read_bytes())
            return {k: v for k, v in data.items() if isinstance(v, list) and len(v) == 4}
        except (OSError, ValueError, AttributeError):
            return {}

    def put_stats(self, key: str, stats: Mapping[str, list[Any]]) -> None:
        if self.root is not None:
            _write(self.root / "stat" / f"{key}.json", json.dumps(stats, sort_keys=True).encode())


def _doc_digest(body: Any) -> str:
    return hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def _write(path: Path, data: bytes) -> None:
    """Through a temporary file and a rename: a reader sees the old entry or the new, never
    half; no fsync (a lost entry is only a miss). A cache that cannot be written is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        log.debug("linkcheck cache: cannot write %s: %s", path, exc)


@dataclass(frozen=True)
class Read:
    """What :func:`read_all` found: the ELF files' facts, and the files it could not read."""

    elf: dict[str, ElfInfo]
    unreadable: dict[str, str]
    hits: int
    misses: int


def _read_one(
    path: str, _buffer: bytearray | None
) -> tuple[str, dict[str, Any] | None, list[str], str | None]:
    """In a worker: (sha256, facts, exports, error) of the file at ``path``."""
    from envbuild.linkcheck.elf import BadElf, is_elf, read_elf

    try:
        with open(path, "rb") as f:
            head = f.read(4)
            f.seek(0)
            info = read_elf(f) if is_elf(head) else None
            digest = _sha256(f)
    except BadElf as exc:
        return "", None, [], f"not a readable ELF file: {exc}"
    except OSError as exc:
        return "", None, [], exc.strerror or str(exc)
    if info is None:
        return digest, None, [], None
    return digest, info.as_dict(), sorted(info.exports), None


def _sha256(f: Any) -> str:
    f.seek(0)
    return hashlib.file_digest(f, "sha256").hexdigest()


def _stat_key(path: str) -> list[Any] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def read_all(
    files: Mapping[str, tuple[str | None, str | None]],
    *,
    cache: Cache | None = None,
    tree_key: str | None = None,
    workers: int | None = None,
) -> Read:
    """The facts of each of ``files`` (``{key: (path on this machine or None, sha256 or
    None)}``) that is a host ELF object, by key. A file without a path must be in the cache
    under its digest. ``tree_key`` names the tree whose stats are remembered (its root)."""
    cache = cache or Cache(None)
    known = cache.stats(tree_key) if tree_key else {}
    stats: dict[str, list[Any]] = {}
    elf: dict[str, ElfInfo] = {}
    unreadable: dict[str, str] = {}
    todo: list[tuple[str, str, int]] = []
    hits = 0
    for key, (path, digest) in files.items():
        now = _stat_key(path) if path is not None else None
        if path is not None and now is None:
            unreadable[key] = "cannot be read"
            continue
        if digest is None and path is not None and (seen := known.get(path)) and seen[:3] == now:
            digest = str(seen[3])
        if digest is not None:
            hit, info = cache.get(digest)
            if hit:
                hits += 1
                if path is not None and now is not None:
                    stats[path] = [*now, digest]
                if info is not None:
                    elf[key] = info
                continue
        if path is None or now is None:
            unreadable[key] = "not in the link-check cache, and not on disk"
            continue
        todo.append((key, path, int(now[0])))
    if not todo:
        if tree_key and stats != {k: v for k, v in known.items() if k in stats}:
            cache.put_stats(tree_key, stats)
        return Read(elf, unreadable, hits, 0)
    from envbuild.installed import hashing

    todo.sort(key=lambda item: -item[2])  # costliest first
    workers = workers or hashing.DEFAULT_WORKERS or os.cpu_count() or 1
    total = sum(size for _, _, size in todo)
    processes = workers > 1 and len(todo) > 1 and hashing.forkable() and total >= 64 << 20
    paths = [path for _, path, _ in todo]
    results = hashing.run_jobs(paths, _read_one, workers=workers, processes=processes)
    for (key, path, _), (digest, data, exports, error) in zip(todo, results, strict=True):
        if error is not None:
            unreadable[key] = error
            continue
        info = ElfInfo.from_dict(data, frozenset(exports)) if data is not None else None
        cache.put(digest, info)
        now = _stat_key(path)
        if now is not None:
            stats[path] = [*now, digest]
        if info is not None:
            elf[key] = info
    if tree_key and stats != {k: v for k, v in known.items() if k in stats}:
        cache.put_stats(tree_key, stats)
    return Read(elf, unreadable, hits, len(todo))


def tree_key(root: str) -> str:
    return hashlib.sha256(os.path.realpath(root).encode()).hexdigest()[:32]
