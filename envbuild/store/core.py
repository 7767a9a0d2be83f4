"""The content-addressed store: blobs named by their sha256, derivations named by their inputs.

Public API (stable; E, F, G and H build on it)::

    store = Store(root)        # or default_store(): $ENVBUILD_STORE, else
                               # $XDG_CACHE_HOME/envbuild/store, else ~/.cache/envbuild/store
    key = derivation_key("layer", {"dists": [...], "compression": "zstd"})  # 64 hex digits

    with store.session():      # hold for a whole build: gc waits until every session ends
        got = store.build("layer", inputs, builder)  # builder() -> Output(outputs=, meta=)
        got.drv.outputs["layer"]       # "sha256:<hex>" of a blob; got.reused: was it cached
        with store.blob_writer() as w:  # stream bytes in; named by their digest on close
            w.write(b"...")
        w.digest                       # "sha256:<hex>"
        store.add_bytes(b"..."), store.add_file(path, expected="sha256:...")
        store.blob_path(digest)        # blobs/sha256/<hex> (read-only: never write to it)
        store.check_blob(digest)       # do its bytes still hash to its name? (see stamps/)
        store.verified_path(digest)    # its path, or IntegrityError naming the fix
        store.set_root(output_root_name(out), blobs=[...], derivations=[key, ...],
                       output=out, image=digest, files={...})
    store.gc(dry_run=True) -> GcResult
    store.verify(repair=False, workers=N) -> VerifyResult

Layout on disk (``STORE_FORMAT`` 1)::

    <root>/format               "envbuild-store 1"
    <root>/blobs/sha256/<hex>   content, named by its sha256 (mode 0444)
    <root>/drv/<key>.json       a Derivation: kind, inputs, outputs (name -> digest), meta
    <root>/roots/<name>.json    a Root: the blobs and derivations an output folder keeps alive
    <root>/stamps/<hex>         size, mtime, ctime, inode and device of a blob when its bytes
                                were last hashed (a cache: deleting it costs one re-hash)
    <root>/locks/               per-derivation lock files and ``gc.lock``
    <root>/tmp/                 files being written; renamed into blobs/ only when complete

Every write goes to ``tmp/`` first, is fsynced, and is renamed into place only after its digest is
known, so a killed writer never leaves a blob whose name is not its digest. Two processes building
the same derivation serialize on ``locks/<key>.lock`` (the second one finds the first one's output);
``gc`` takes ``locks/gc.lock`` exclusively while every session holds it shared.

A blob is trusted only while its bytes hash to its name. Re-hashing gigabytes at every build
would make a no-op build slow, so, like git's index, the store keeps each blob's stat (size,
mtime, ctime, inode, device) from when its bytes were last hashed and re-hashes only a blob whose
stat changed since (a write through a hard link, a ``chmod``, a copy put in its place): see
:meth:`Store.check_blob`. What no stat shows (a bit flipped on the disk itself) is found by
:meth:`Store.verify` (``envbuild store verify``), which hashes everything. Bytes read anyway
(:meth:`Store.read_blob`) are always hashed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envbuild.errors import IntegrityError, StoreError, UsageError
from envbuild.fsio import canonical_json, compact_json, fsync_dir

log = logging.getLogger("envbuild.store.core")

#: Bumped when the meaning of a derivation key or the layout changes; part of every key.
STORE_FORMAT = 1
CHUNK = 1 << 20
DIGEST_RE = re.compile(r"^sha256:([0-9a-f]{64})$")
KEY_RE = re.compile(r"^[0-9a-f]{64}$")
ROOT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,199}$")
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def default_store() -> Store:
    """The store named by ``$ENVBUILD_STORE``, else ``$XDG_CACHE_HOME/envbuild/store``, else
    ``~/.cache/envbuild/store``."""
    if explicit := os.environ.get("ENVBUILD_STORE"):
        return Store(Path(explicit).expanduser())
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Store(Path(cache).expanduser() / "envbuild" / "store")


def derivation_key(kind: str, inputs: Mapping[str, Any]) -> str:
    """sha256 (64 hex digits) of the compact canonical JSON of ``{kind, inputs, store format}``.

    ``inputs`` must be JSON data (str, int, bool, None, lists, str-keyed dicts): the parent's key,
    locked files with their sha256, flags, file digests. Never put a host path, a time or a secret
    into ``inputs``: the key must be the same on every machine.
    """
    try:
        payload = compact_json({"kind": kind, "inputs": inputs, "store_format": STORE_FORMAT})
    except (TypeError, ValueError) as exc:
        raise TypeError(f"derivation inputs of {kind!r} are not JSON data: {exc}") from None
    return hashlib.sha256(payload).hexdigest()


def digest_hex(digest: str) -> str:
    """The hex part of ``sha256:<hex>``; raises :class:`IntegrityError` on anything else."""
    m = DIGEST_RE.match(digest)
    if not m:
        raise IntegrityError(f"{digest!r} is not a sha256 digest (expected sha256:<64 hex>)")
    return m.group(1)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Derivation(_Model):
    """The record of one built step: what went in (``inputs``), what came out (``outputs``: name ->
    blob digest) and anything else the step wants to remember (``meta``, JSON)."""

    store_format: int = STORE_FORMAT
    key: str
    kind: str
    inputs: dict[str, Any]
    outputs: dict[str, str] = Field(default_factory=dict)
    meta: dict[str, Any] = Field(default_factory=dict)


class Root(_Model):
    """What one output folder (or a user) keeps alive through ``gc``.

    A root of an output folder (``output``: its absolute path; ``image``: the digest it holds)
    lives as long as the folder holds that image, the way a Nix out-link does: ``gc`` drops it
    once the folder is removed or holds another image. ``files`` records the stat of what the
    build wrote there (see :func:`file_stamp`), so the next build can tell the folder is
    unchanged without reading it."""

    name: str
    blobs: list[str] = Field(default_factory=list)
    derivations: list[str] = Field(default_factory=list)
    output: str | None = None
    image: str | None = None
    files: dict[str, str] = Field(default_factory=dict)


def output_root_name(out: Path) -> str:
    """The root name of the output folder ``out`` (one per absolute path)."""
    where = str(Path(out).absolute())
    return f"out-{hashlib.sha256(where.encode()).hexdigest()[:32]}"


def file_stamp(st: os.stat_result) -> str:
    """What changes whenever a file's bytes may have: size, mtime, ctime, inode, device (git's
    index keeps the same). ctime cannot be set back by a user, so a write followed by
    ``touch -d`` still shows."""
    return f"{st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {st.st_ino} {st.st_dev}"


def _same_but_ctime(a: str, b: str) -> bool:
    x, y = a.split(), b.split()
    return len(x) == len(y) == 5 and x[:2] == y[:2] and x[3:] == y[3:]


@dataclass(frozen=True)
class Output:
    """What a builder returns to :meth:`Store.build`: blob digests by name, and metadata."""

    outputs: Mapping[str, str]
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Realized:
    drv: Derivation
    reused: bool


@dataclass(frozen=True)
class GcResult:
    dry_run: bool
    removed_blobs: list[str]
    removed_derivations: list[str]
    removed_temp: int
    freed_bytes: int
    removed_roots: list[str]
    kept_blobs: int
    kept_derivations: int
    roots: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "removed_blobs": self.removed_blobs,
            "removed_derivations": self.removed_derivations,
            "removed_temp": self.removed_temp,
            "removed_roots": self.removed_roots,
            "freed_bytes": self.freed_bytes,
            "kept_blobs": self.kept_blobs,
            "kept_derivations": self.kept_derivations,
            "roots": self.roots,
        }


@dataclass(frozen=True)
class VerifyProblem:
    """One thing ``store verify`` found wrong: a blob (and the derivations that name it) or a
    derivation record; what is wrong; what fixes it; and whether ``--repair`` did."""

    what: str  # "blob" or "derivation"
    name: str  # the digest or the key
    reason: str
    fix: str
    derivations: list[str] = field(default_factory=list)  # "kind key" naming a blob
    repaired: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "name": self.name,
            "reason": self.reason,
            "fix": self.fix,
            "derivations": self.derivations,
            "repaired": self.repaired,
        }

    def render(self) -> str:
        by = f" (output of {', '.join(self.derivations)})" if self.derivations else ""
        done = "; repaired" if self.repaired else ""
        return f"{self.what} {self.name}{by}: {self.reason} (fix: {self.fix}){done}"


@dataclass(frozen=True)
class VerifyResult:
    checked: int
    corrupt: list[str]  # blob digests whose content does not hash to their name
    broken: list[str]  # derivation keys whose outputs are missing or corrupt
    checked_bytes: int = 0
    derivations: int = 0
    problems: list[VerifyProblem] = field(default_factory=list)
    repaired: bool = False

    @property
    def ok(self) -> bool:
        return not self.corrupt and not self.broken

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checked_blobs": self.checked,
            "checked_bytes": self.checked_bytes,
            "checked_derivations": self.derivations,
            "corrupt_blobs": self.corrupt,
            "broken_derivations": self.broken,
            "problems": [p.as_dict() for p in self.problems],
            "repaired": self.repaired,
        }


def _store_error(root: Path, exc: OSError, doing: str) -> StoreError:
    if exc.errno in _NO_SPACE:
        return StoreError(
            f"no space left on device while {doing} in the store {root}",
            hint="free disk space (`envbuild gc` removes what no image uses) or move the store "
            "with --store / $ENVBUILD_STORE",
        )
    return StoreError(
        f"cannot use the store {root} while {doing}: {exc.strerror or exc}",
        hint="check the directory's permissions, or choose another store with --store",
    )


class _Flock:
    """An ``flock`` on a file: shared or exclusive, released on exit (also by the kernel when the
    process dies)."""

    def __init__(self, path: Path, *, shared: bool, what: str) -> None:
        self.path, self.shared, self.what = path, shared, what
        self.fd = -1

    def __enter__(self) -> _Flock:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        op = fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX
        try:
            fcntl.flock(self.fd, op | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for %s", self.what)
            fcntl.flock(self.fd, op)
        except BaseException:
            os.close(self.fd)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # closing the descriptor releases the lock
        self.fd = -1


class BlobWriter:
    """Bytes written here become one blob. Use through :meth:`Store.blob_writer`."""

    def __init__(self, store: Store, f: IO[bytes], tmp: Path) -> None:
        self._store, self._f, self._tmp = store, f, tmp
        self._hash = hashlib.sha256()
        self.size = 0
        self.digest = ""  # set when the block ends

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._hash.update(data)
        try:
            self._f.write(data)
        except OSError as exc:
            raise _store_error(self._store.root, exc, "writing a blob") from exc
        self.size += len(data)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


class Store:
    """A content-addressed store rooted at ``root`` (created on first use)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).absolute()
        self.blobs = self.root / "blobs" / "sha256"
        self.drvs = self.root / "drv"
        self.roots_dir = self.root / "roots"
        self.locks = self.root / "locks"
        self.tmp = self.root / "tmp"
        self.stamps = self.root / "stamps"
        #: blobs hashed by this process, with their stamp then: no stamp file read twice
        self._checked: dict[str, str] = {}
        self._session_depth = 0
        self._session_lock: _Flock | None = None
        self._mutex = threading.RLock()
        self._ready = False

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r})"

    # -- setup and locking -------------------------------------------------------------------

    def _ensure(self) -> None:
        if self._ready:
            return
        try:
            for d in (self.blobs, self.drvs, self.roots_dir, self.locks, self.tmp, self.stamps):
                d.mkdir(parents=True, exist_ok=True)
            marker = self.root / "format"
            if marker.exists():
                found = marker.read_text().strip()
                if found != f"envbuild-store {STORE_FORMAT}":
                    raise StoreError(
                        f"{self.root} is a store of another format ({found!r}); this envbuild "
                        f"writes format {STORE_FORMAT}",
                        hint="use another store directory (--store) or upgrade envbuild",
                    )
            else:
                self._write_file(marker, f"envbuild-store {STORE_FORMAT}\n".encode())
        except OSError as exc:
            raise _store_error(self.root, exc, "creating its directories") from exc
        self._ready = True

    @contextlib.contextmanager
    def session(self) -> Iterator[Store]:
        """Hold the store against ``gc`` for the duration of the block (shared, re-entrant).

        Wrap a whole build in it, from the first lookup until the image's root is written:
        ``gc`` waits until no session is open, so nothing a build has made but not yet rooted is
        removed under it.
        """
        self._ensure()
        with self._mutex:
            if self._session_depth == 0:
                lock = _Flock(self.locks / "gc.lock", shared=True, what="a store gc to finish")
                lock.__enter__()
                self._session_lock = lock
            self._session_depth += 1
        try:
            yield self
        finally:
            with self._mutex:
                self._session_depth -= 1
                if self._session_depth == 0 and self._session_lock is not None:
                    self._session_lock.__exit__(None, None, None)
                    self._session_lock = None

    def lock(self, key: str) -> contextlib.AbstractContextManager[object]:
        """An exclusive lock on one derivation key (what :meth:`build` holds while building)."""
        self._ensure()
        if not KEY_RE.match(key):
            raise ValueError(f"not a derivation key: {key!r}")
        return _Flock(self.locks / f"{key}.lock", shared=False, what=f"another build of {key[:12]}")

    # -- blobs -------------------------------------------------------------------------------

    def blob_path(self, digest: str) -> Path:
        """Where the blob ``sha256:<hex>`` lives (whether or not it exists). Never write to it."""
        return self.blobs / digest_hex(digest)

    def has_blob(self, digest: str) -> bool:
        return self.blob_path(digest).is_file()

    @contextlib.contextmanager
    def blob_writer(self, *, expected: str | None = None) -> Iterator[BlobWriter]:
        """Stream one blob in. When the block ends the bytes are fsynced and renamed to
        ``blobs/sha256/<their digest>`` (``writer.digest``); an error or a kill leaves only a temp
        file that ``gc`` removes. With ``expected`` a mismatch raises :class:`IntegrityError` and
        stores nothing."""
        with self.session():
            try:
                fd, name = tempfile.mkstemp(prefix="blob-", suffix=".tmp", dir=self.tmp)
            except OSError as exc:
                raise _store_error(self.root, exc, "creating a temporary file") from exc
            tmp = Path(name)
            try:
                with os.fdopen(fd, "wb", buffering=0) as f:
                    writer = BlobWriter(self, f, tmp)
                    yield writer
                    try:
                        os.fsync(f.fileno())
                    except OSError as exc:
                        raise _store_error(self.root, exc, "writing a blob") from exc
                hexd = writer.hexdigest()
                digest = f"sha256:{hexd}"
                if expected is not None and digest != expected:
                    raise IntegrityError(
                        f"content does not match its digest: expected {expected}, got {digest}",
                        hint="the source changed or was corrupted; fetch it again",
                    )
                final = self.blobs / hexd
                if self.check_blob(digest):  # the same bytes are here: keep their file (and
                    writer.digest = digest  # the hard links of output folders to it)
                    return
                try:
                    os.chmod(tmp, 0o444)
                    os.replace(tmp, final)
                    fsync_dir(self.blobs)
                except OSError as exc:
                    raise _store_error(self.root, exc, "storing a blob") from exc
                self._stamp(hexd, final)  # the bytes under that name were hashed just now
                writer.digest = digest
            finally:
                tmp.unlink(missing_ok=True)

    def add_bytes(self, data: bytes, *, expected: str | None = None) -> str:
        """Store ``data``; returns its digest ``sha256:<hex>``. Bytes already stored (and
        intact) are not written again."""
        digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
        if (expected is None or digest == expected) and self.check_blob(digest):
            return digest
        with self.blob_writer(expected=expected) as w:
            w.write(data)
        return w.digest

    def add_file(self, path: Path, *, expected: str | None = None) -> str:
        """Copy the file at ``path`` into the store (streaming); returns its digest. When
        ``expected`` is given and already stored, the file is not read at all."""
        if expected is not None and self.check_blob(expected):
            return expected
        with self.blob_writer(expected=expected) as w, Path(path).open("rb") as src:
            while chunk := src.read(CHUNK):
                w.write(chunk)
        return w.digest

    def read_blob(self, digest: str) -> bytes:
        """The bytes of a (small) blob, hashed on the way: a corrupt blob raises
        :class:`IntegrityError`."""
        try:
            data = self.blob_path(digest).read_bytes()
        except FileNotFoundError:
            raise StoreError(f"blob {digest} is not in the store {self.root}") from None
        if hashlib.sha256(data).hexdigest() != digest_hex(digest):
            raise self.corrupt_error(digest)
        return data

    # -- blob integrity ----------------------------------------------------------------------

    def _stamp(self, hexd: str, path: Path) -> None:
        """Record that ``path``'s bytes were hashed and match ``hexd`` (best effort: a lost
        stamp costs one re-hash). Not fsynced: a stamp that did not reach the disk is absent."""
        try:
            stamp = file_stamp(path.stat())
            tmp = self.stamps / f".{hexd}.{os.getpid()}.{threading.get_native_id()}"
            tmp.write_text(stamp)
            os.replace(tmp, self.stamps / hexd)
        except OSError as exc:
            log.debug("cannot record the stamp of %s: %s", hexd[:12], exc)
            return
        self._checked[hexd] = stamp

    def _hash_file(self, path: Path) -> str:
        h = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
        return h.hexdigest()

    def check_blob(self, digest: str) -> bool:
        """Whether blob ``digest`` is here and its bytes hash to its name. Cheap when the
        blob's stat is what it was when its bytes were last hashed (see the module's doc);
        otherwise the blob is hashed again now."""
        self._ensure()
        hexd = digest_hex(digest)
        path = self.blobs / hexd
        try:
            now = file_stamp(path.stat())
        except FileNotFoundError:
            return False
        if self._checked.get(hexd) == now:
            return True
        try:
            if (self.stamps / hexd).read_text() == now:
                self._checked[hexd] = now
                return True
        except (OSError, UnicodeDecodeError):
            pass
        log.debug("blob %s changed since it was hashed: hashing it again", hexd[:12])
        try:
            ok = self._hash_file(path) == hexd
        except FileNotFoundError:
            return False
        if ok:
            self._stamp(hexd, path)
        else:
            self._checked.pop(hexd, None)
        return ok

    def corrupt_error(self, digest: str, what: str = "") -> IntegrityError:
        return IntegrityError(
            f"store blob {digest}{f' ({what})' if what else ''} no longer matches its digest: "
            f"{self.blob_path(digest)} was changed or damaged",
            hint="run `envbuild store verify --repair` (it drops what is broken; the next "
            "build makes or fetches it again), then rerun",
        )

    def verified_path(self, digest: str, what: str = "") -> Path:
        """The path of blob ``digest`` once :meth:`check_blob` says its bytes are right;
        :class:`IntegrityError` (naming the blob, ``what`` it is, and the fix) when not."""
        if not self.check_blob(digest):
            if not self.has_blob(digest):
                raise StoreError(f"blob {digest} is not in the store {self.root}")
            raise self.corrupt_error(digest, what)
        return self.blob_path(digest)

    def linked(self, digest: str) -> None:
        """Call after hard-linking blob ``digest`` somewhere: a new link changes the inode's
        ctime, which alone must not make the next check re-hash it."""
        hexd = digest_hex(digest)
        path = self.blobs / hexd
        try:
            now = file_stamp(path.stat())
        except OSError:
            return
        before = self._checked.get(hexd)
        if before is not None and before != now and _same_but_ctime(before, now):
            self._stamp(hexd, path)

    def drop_blob(self, digest: str) -> None:
        """Remove a (corrupt) blob and its stamp; what needs it is made or fetched again."""
        hexd = digest_hex(digest)
        self._checked.pop(hexd, None)
        (self.blobs / hexd).unlink(missing_ok=True)
        (self.stamps / hexd).unlink(missing_ok=True)

    def open_blob(self, digest: str) -> IO[bytes]:
        try:
            return self.blob_path(digest).open("rb")
        except FileNotFoundError:
            raise StoreError(f"blob {digest} is not in the store {self.root}") from None

    @contextlib.contextmanager
    def temp_dir(self, prefix: str = "work-") -> Iterator[Path]:
        """A scratch directory inside the store (same file system as the blobs), removed after
        the block; ``gc`` removes any that a killed process left behind."""
        with self.session():
            try:
                path = Path(tempfile.mkdtemp(prefix=prefix, dir=self.tmp))
            except OSError as exc:
                raise _store_error(self.root, exc, "creating a scratch directory") from exc
            try:
                yield path
            finally:
                _rmtree(path)

    # -- derivations -------------------------------------------------------------------------

    def lookup(self, key: str) -> Derivation | None:
        """The recorded derivation ``key`` if it and every output blob are present, else None."""
        self._ensure()
        path = self.drvs / f"{key}.json"
        try:
            drv = Derivation.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return None
        except (ValidationError, ValueError):
            log.warning("ignoring unreadable derivation record %s", path)
            return None
        missing = [d for d in drv.outputs.values() if not self.has_blob(d)]
        if missing:
            log.warning(
                "derivation %s lost output %s; it will be built again", key[:12], missing[0]
            )
            return None
        for name, digest in drv.outputs.items():
            if not self.check_blob(digest):
                log.warning(
                    "output %s (%s) of %s %s is corrupt; removing it, it will be built again",
                    name, digest, drv.kind, key[:12],
                )  # fmt: skip
                self.drop_blob(digest)
                return None
        return drv

    def available(self, key: str) -> bool:
        """Whether derivation ``key`` can be had without running its builder: it is here (a
        store with a remote cache in front also asks the cache)."""
        return self.lookup(key) is not None

    def record(
        self,
        kind: str,
        inputs: Mapping[str, Any],
        outputs: Mapping[str, str],
        meta: Mapping[str, Any] | None = None,
    ) -> Derivation:
        """Record that derivation ``(kind, inputs)`` produced ``outputs`` (blobs already stored)."""
        key = derivation_key(kind, inputs)
        for name, digest in outputs.items():
            if not self.has_blob(digest):
                raise StoreError(f"output {name!r} of {kind} {key[:12]}: blob {digest} not stored")
        drv = Derivation(
            key=key,
            kind=kind,
            inputs=json.loads(compact_json(dict(inputs))),
            outputs=dict(outputs),
            meta=json.loads(compact_json(dict(meta or {}))),
        )
        with self.session():
            self._write_file(self.drvs / f"{key}.json", canonical_json(drv.model_dump()).encode())
        return drv

    def build(
        self, kind: str, inputs: Mapping[str, Any], builder: Callable[[], Output]
    ) -> Realized:
        """Return the derivation ``(kind, inputs)``, running ``builder`` only if it is not yet
        in the store. Two processes asking for the same key at once: one builds, the other waits
        on the key's lock and then reuses the result."""
        key = derivation_key(kind, inputs)
        with self.session():
            if (drv := self.lookup(key)) is not None:
                log.debug("%s %s: reused", kind, key[:12])
                return Realized(drv, reused=True)
            with self.lock(key):
                if (drv := self.lookup(key)) is not None:
                    log.debug("%s %s: built by another process", kind, key[:12])
                    return Realized(drv, reused=True)
                log.debug("%s %s: building", kind, key[:12])
                out = builder()
                return Realized(self.record(kind, inputs, out.outputs, out.meta), reused=False)

    def derivations(self) -> list[str]:
        self._ensure()
        return sorted(p.name[: -len(".json")] for p in self.drvs.glob("*.json"))

    # -- roots and gc -----------------------------------------------------------------------

    def set_root(
        self,
        name: str,
        *,
        blobs: Iterable[str] = (),
        derivations: Iterable[str] = (),
        output: Path | None = None,
        image: str | None = None,
        files: Mapping[str, str] | None = None,
    ) -> Root:
        """Make ``name`` keep ``blobs`` and ``derivations`` (and their outputs) alive; replaces
        an earlier root of that name. Image manifests and indexes among ``blobs`` keep the config
        and layers they name alive too. With ``output`` (and the ``image`` digest it holds) the
        root lives only as long as that folder holds that image (see :class:`Root`)."""
        if not ROOT_NAME_RE.match(name):
            raise UsageError(
                f"{name!r} is not a valid root name", hint="use letters, digits and . _ @ + -"
            )
        blob_list = sorted(set(blobs))
        for digest in blob_list:
            digest_hex(digest)
        drv_list = sorted(set(derivations))
        for key in drv_list:
            if not KEY_RE.match(key):
                raise ValueError(f"not a derivation key: {key!r}")
        root = Root(
            name=name,
            blobs=blob_list,
            derivations=drv_list,
            output=str(Path(output).absolute()) if output is not None else None,
            image=image,
            files=dict(sorted((files or {}).items())),
        )
        with self.session():
            self._write_file(
                self.roots_dir / f"{name}.json", canonical_json(root.model_dump()).encode()
            )
        return root

    def remove_root(self, name: str) -> bool:
        self._ensure()
        try:
            (self.roots_dir / f"{name}.json").unlink()
            return True
        except FileNotFoundError:
            return False

    def get_root(self, name: str) -> Root | None:
        """The root ``name``, or None when there is none (or it is unreadable)."""
        self._ensure()
        try:
            return Root.model_validate_json((self.roots_dir / f"{name}.json").read_bytes())
        except (OSError, ValidationError, ValueError):
            return None

    def lock_output(self, out: Path) -> contextlib.AbstractContextManager[object]:
        """An exclusive lock on writing the output folder ``out`` (two builds into one folder
        take turns)."""
        self._ensure()
        name = output_root_name(out)
        return _Flock(self.locks / f"{name}.lock", shared=False, what=f"another build into {out}")

    def roots(self) -> dict[str, Root]:
        self._ensure()
        found: dict[str, Root] = {}
        for path in sorted(self.roots_dir.glob("*.json")):
            try:
                root = Root.model_validate_json(path.read_bytes())
            except (ValidationError, ValueError) as exc:
                raise StoreError(
                    f"root {path} is unreadable; gc will not guess what it kept alive",
                    hint="remove the file if you no longer need that image",
                ) from exc
            found[root.name] = root
        return found

    def gc(self, *, dry_run: bool = False) -> GcResult:
        """Remove every blob and derivation no root keeps alive, and leftover temp files.

        Live: the blobs and derivations a root names; the outputs of live derivations; what a
        live image manifest or index names; and every derivation whose outputs are all live
        (cheap records that stay valid). Waits until no build holds a session.
        """
        self._ensure()
        if self._session_depth:
            raise StoreError("gc cannot run inside a session of the same store")
        with _Flock(self.locks / "gc.lock", shared=False, what="running builds to finish"):
            roots = self.roots()
            stale_roots = sorted(n for n, r in roots.items() if not _output_holds(r))
            for name in stale_roots:
                log.info(
                    "root %s: %s no longer holds %s", name, roots[name].output, roots[name].image
                )
                del roots[name]
            live_blobs: set[str] = set()
            live_drvs: set[str] = set()
            records: dict[str, Derivation] = {}
            for key in self.derivations():
                try:
                    records[key] = Derivation.model_validate_json(
                        (self.drvs / f"{key}.json").read_bytes()
                    )
                except (ValidationError, ValueError):
                    log.warning("derivation record %s is unreadable; removing it", key)
            for root in roots.values():
                live_blobs.update(root.blobs)
                for key in root.derivations:
                    if key in records:
                        live_drvs.add(key)
                        live_blobs.update(records[key].outputs.values())
            self._follow_manifests(live_blobs)
            for key, drv in records.items():
                if drv.outputs and set(drv.outputs.values()) <= live_blobs:
                    live_drvs.add(key)
            dead_drvs = sorted(set(self.derivations()) - live_drvs)
            dead_blobs: list[str] = []
            freed = 0
            all_blobs = sorted(self.blobs.iterdir())
            for path in all_blobs:
                digest = f"sha256:{path.name}"
                if digest not in live_blobs:
                    dead_blobs.append(digest)
                    freed += path.lstat().st_size
            temps = sorted(self.tmp.iterdir())
            stale_locks = [p for p in self.locks.iterdir() if p.name != "gc.lock"]
            kept_hex = {p.name for p in all_blobs} - {digest_hex(d) for d in dead_blobs}
            stale_stamps = [p for p in self.stamps.iterdir() if p.name not in kept_hex]
            if not dry_run:
                for name in stale_roots:
                    (self.roots_dir / f"{name}.json").unlink(missing_ok=True)
                for key in dead_drvs:
                    (self.drvs / f"{key}.json").unlink(missing_ok=True)
                for digest in dead_blobs:
                    self.blob_path(digest).unlink(missing_ok=True)
                for path in stale_stamps:
                    path.unlink(missing_ok=True)
                for path in temps:
                    _rmtree(path)
                for path in stale_locks:
                    path.unlink(missing_ok=True)
        return GcResult(
            dry_run=dry_run,
            removed_blobs=dead_blobs,
            removed_derivations=dead_drvs,
            removed_temp=len(temps),
            removed_roots=stale_roots,
            freed_bytes=freed,
            kept_blobs=len(all_blobs) - len(dead_blobs),
            kept_derivations=len(live_drvs),
            roots=len(roots),
        )

    def _follow_manifests(self, live: set[str]) -> None:
        """Add what live OCI/Docker manifests and indexes name (config, layers, manifests)."""
        todo = list(live)
        while todo:
            digest = todo.pop()
            path = self.blob_path(digest)
            try:
                if path.stat().st_size > 4 << 20:
                    continue
                with path.open("rb") as f:
                    if f.read(1) != b"{":
                        continue
                doc = json.loads(path.read_bytes())
            except (OSError, ValueError):
                continue
            if not isinstance(doc, dict):
                continue
            named: list[Any] = []
            if isinstance(doc.get("config"), dict):
                named.append(doc["config"])
            for key in ("layers", "manifests"):
                if isinstance(doc.get(key), list):
                    named.extend(doc[key])
            for desc in named:
                d = desc.get("digest") if isinstance(desc, dict) else None
                if isinstance(d, str) and DIGEST_RE.match(d) and d not in live:
                    live.add(d)
                    todo.append(d)

    def verify(self, *, repair: bool = False, workers: int | None = None) -> VerifyResult:
        """Hash every blob (``workers`` threads at once: hashlib lets go of the GIL) and check
        every derivation record and its outputs. With ``repair`` corrupt blobs are removed (a
        wheel is fetched again, an image's config or manifest written again by the next build)
        and so are the records that lost an output (the next build makes them again)."""
        self._ensure()
        with self.session():
            paths = sorted(p for p in self.blobs.iterdir() if not p.name.startswith("."))
            sizes = {p.name: p.lstat().st_size for p in paths}

            def check(path: Path) -> bool:
                try:
                    ok = path.is_file() and self._hash_file(path) == path.name
                except OSError:
                    ok = False
                if ok:
                    self._stamp(path.name, path)
                return ok

            n = workers or min(8, os.cpu_count() or 1)
            # biggest first, so that one big layer does not finish alone at the end
            order = sorted(paths, key=lambda p: -sizes[p.name])
            with ThreadPoolExecutor(max_workers=max(1, n), thread_name_prefix="verify") as pool:
                good = dict(zip(order, pool.map(check, order), strict=True))
            corrupt = sorted(f"sha256:{p.name}" for p, ok in good.items() if not ok)
            bad = set(corrupt)
            named_by: dict[str, list[str]] = {}
            broken: list[str] = []
            problems: list[VerifyProblem] = []
            keys = self.derivations()
            for key in keys:
                try:
                    drv = Derivation.model_validate_json((self.drvs / f"{key}.json").read_bytes())
                except (ValidationError, ValueError, OSError):
                    broken.append(key)
                    problems.append(
                        VerifyProblem(
                            "derivation", key, "its record is unreadable",
                            "`--repair` removes it; the next build makes it again",
                        )
                    )  # fmt: skip
                    continue
                if drv.key != key or derivation_key(drv.kind, drv.inputs) != key:
                    broken.append(key)
                    problems.append(
                        VerifyProblem(
                            "derivation", key, f"its record ({drv.kind}) is not the one its "
                            "name promises (its inputs hash to another key)",
                            "`--repair` removes it; the next build makes it again",
                        )
                    )  # fmt: skip
                    continue
                for name, digest in sorted(drv.outputs.items()):
                    named_by.setdefault(digest, []).append(f"{drv.kind} {key[:12]}")
                    if digest in bad or not self.has_blob(digest):
                        broken.append(key)
                        state = "is corrupt" if digest in bad else "is missing"
                        problems.append(
                            VerifyProblem(
                                "derivation", key, f"{drv.kind}: its output {name!r} ({digest}) "
                                f"{state}", "`--repair` removes the record; the next build makes "
                                f"the {drv.kind} again",
                            )
                        )  # fmt: skip
                        break
            for digest in corrupt:
                problems.insert(
                    0,
                    VerifyProblem(
                        "blob", digest, "its bytes do not hash to its name",
                        "`--repair` removes it; the next build makes or fetches it again",
                        derivations=named_by.get(digest, []),
                    ),
                )  # fmt: skip
            broken = sorted(set(broken))
            if repair:
                for digest in corrupt:
                    self.drop_blob(digest)
                for key in broken:
                    (self.drvs / f"{key}.json").unlink(missing_ok=True)
                problems = [replace(p, repaired=True) for p in problems]
        return VerifyResult(
            checked=len(paths),
            corrupt=corrupt,
            broken=broken,
            checked_bytes=sum(sizes.values()),
            derivations=len(keys),
            problems=problems,
            repaired=repair and bool(problems),
        )

    # -- helpers -----------------------------------------------------------------------------

    def _write_file(self, path: Path, data: bytes) -> None:
        """Atomically write a small metadata file (temp in tmp/, fsync, rename)."""
        tmp_dir = self.tmp if self.tmp.is_dir() else path.parent
        try:
            fd, name = tempfile.mkstemp(prefix="meta-", suffix=".tmp", dir=tmp_dir)
        except OSError as exc:
            raise _store_error(self.root, exc, f"writing {path.name}") from exc
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(name, 0o644)
            os.replace(name, path)
        except OSError as exc:
            raise _store_error(self.root, exc, f"writing {path.name}") from exc
        finally:
            Path(name).unlink(missing_ok=True)


def _output_holds(root: Root) -> bool:
    """Whether the output folder of ``root`` still holds the image it was made for (a root
    that names no folder always lives)."""
    if root.output is None:
        return True
    try:
        with (Path(root.output) / "build-manifest.json").open("rb") as f:
            data = f.read(MAX_MANIFEST + 1)
        doc = json.loads(data) if len(data) <= MAX_MANIFEST else None
    except (OSError, ValueError, RecursionError):  # whatever the folder holds now
        return False
    return isinstance(doc, dict) and doc.get("image") == root.image


#: A build manifest bigger than this is not one envbuild wrote (they are kilobytes).
MAX_MANIFEST = 64 << 20


def _rmtree(path: Path) -> None:
    """Remove a file or a tree, read-only directories included."""
    if not path.is_dir() or path.is_symlink():
        path.unlink(missing_ok=True)
        return
    try:
        shutil.rmtree(path)
    except OSError:
        for dirpath, _dirs, _files in os.walk(path):
            with contextlib.suppress(OSError):
                os.chmod(dirpath, 0o755)
        shutil.rmtree(path, ignore_errors=True)
