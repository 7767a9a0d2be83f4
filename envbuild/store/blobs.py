"""The store's folder and its blobs: bytes named by their sha256, written atomically, checked.

Layout on disk (``STORE_FORMAT`` 1)::

    <root>/format               "envbuild-store 1"
    <root>/blobs/sha256/<hex>   content, named by its sha256 (mode 0444)
    <root>/drv/<key>.json       derivation records (:mod:`envbuild.store.core`)
    <root>/roots/<name>.json    roots: what gc keeps (:mod:`envbuild.store.core`, ``.gc``)
    <root>/stamps/<hex>         the stat of a blob when its bytes were last hashed
                                (:mod:`envbuild.store.stamps`)
    <root>/locks/               per-derivation lock files and ``gc.lock``
    <root>/tmp/                 files being written; renamed into blobs/ only when complete

Every write goes to ``tmp/`` first, is fsynced, and is renamed into place only after its digest is
known, so a killed writer never leaves a blob whose name is not its digest. A build holds a
:meth:`BlobStore.session` (``locks/gc.lock`` shared) from its first lookup until its root is
written; ``gc`` takes that lock exclusively, so it never removes what a running build made but
has not rooted yet. Bytes read in full (:meth:`BlobStore.read_blob`) are always hashed; a blob
handed out by path is checked through its stamp (:meth:`BlobStore.check_blob`).

A blob is a regular file of mode 0444: output folders hard-link it, so its mode is theirs, and
envbuild runs as root, which reads a file of mode 0000 all the same. So the mode is checked with
the bytes (a wrong one is put back when the bytes are right), and a name taken by anything else
(a folder, a fifo, a symlink) is no blob: it is never opened (a fifo would block the build
forever), counts as missing, and is replaced when the blob is made or fetched again.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Protocol, Self

from envbuild import scratch
from envbuild.errors import IntegrityError, StoreError
from envbuild.fsio import fsync_dir, no_space, rmtree
from envbuild.oci.layout import DIGEST_RE
from envbuild.store.stamps import Stamps, open_regular

log = logging.getLogger(__name__)

#: Bumped when the meaning of a derivation key or the layout changes; part of every key.
STORE_FORMAT = 1
CHUNK = 1 << 20
#: Every blob's mode: read-only, readable by every user (output folders hard-link blobs).
BLOB_MODE = 0o444
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def digest_hex(digest: str) -> str:
    """The hex part of ``sha256:<hex>``; raises :class:`IntegrityError` on anything else."""
    m = DIGEST_RE.match(digest)
    if not m:
        raise IntegrityError(f"{digest!r} is not a sha256 digest (expected sha256:<64 hex>)")
    return m.group(1)


def store_error(root: Path, exc: OSError, doing: str, where: Path | None = None) -> StoreError:
    """The :class:`StoreError` for an OS failure while ``doing`` something in the store
    ``root``: a full disk says how to free space (naming the folder that is full: ``where``,
    else the file's), anything else what to check."""
    if exc.errno in _NO_SPACE:  # name the folder that is full (the store's tmp may be apart)
        if where is None:
            where = Path(exc.filename).parent if isinstance(exc.filename, str) else root
        full = no_space(where, doing=f"{doing} in the store {root}")
        return StoreError(
            full.message,
            hint="free disk space (`envbuild gc` removes what no image uses) or move the store "
            "with --store / $ENVBUILD_STORE",
        )
    return StoreError(
        f"cannot use the store {root} while {doing}: {exc.strerror or exc}",
        hint="check the directory's permissions, or choose another store with --store",
    )


class Readable(Protocol):
    """What :meth:`BlobStore.add_stream` reads from (a file, an
    :class:`envbuild.oci.core.BlobStream`)."""

    def read(self, n: int = -1, /) -> bytes: ...


def default_root() -> Path:
    """Where the store is: ``$ENVBUILD_STORE``, else ``$XDG_CACHE_HOME/envbuild/store``, else
    ``~/.cache/envbuild/store``."""
    if explicit := os.environ.get("ENVBUILD_STORE"):
        return Path(explicit).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "envbuild" / "store"


def output_root_name(out: Path) -> str:
    """The root name of the output folder ``out`` (one per absolute path)."""
    where = str(Path(out).absolute())
    return f"out-{hashlib.sha256(where.encode()).hexdigest()[:32]}"


class FileGuard:
    """An ``flock`` on a file: shared or exclusive, released on exit (also by the kernel when the
    process dies). ``what`` names what a blocked caller waits for, in the log."""

    def __init__(self, path: Path, *, shared: bool, what: str) -> None:
        self.path, self.shared, self.what = path, shared, what
        self.fd = -1

    def __enter__(self) -> FileGuard:
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
    """Bytes written here become one blob. Use through :meth:`BlobStore.blob_writer`."""

    def __init__(self, store: BlobStore, f: IO[bytes], tmp: Path) -> None:
        self._store, self._f, self._tmp = store, f, tmp
        self._hash = hashlib.sha256()
        self.size = 0
        self.digest = ""  # set when the block ends

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Append ``data`` to the blob (a full disk is a :class:`StoreError`)."""
        self._hash.update(data)
        try:
            self._f.write(data)
        except OSError as exc:
            raise store_error(self._store.root, exc, "writing a blob") from exc
        self.size += len(data)

    def hexdigest(self) -> str:
        """The sha256 (hex) of what was written so far."""
        return self._hash.hexdigest()


class BlobStore:
    """The folder ``root`` of a store (created on first use) and the blobs in it. The
    derivations and roots on top are :class:`envbuild.store.core.Store`'s."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).absolute()
        self.blobs = self.root / "blobs" / "sha256"
        self.drvs = self.root / "drv"
        self.roots_dir = self.root / "roots"
        self.guards = self.root / "locks"
        self.tmp = self.root / "tmp"
        self.stamps = self.root / "stamps"
        self._stamped = Stamps(self.stamps)
        self._session_depth = 0
        self._session_guard: FileGuard | None = None
        self._mutex = threading.RLock()
        self._ready = False

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r})"

    # -- setup and locking -------------------------------------------------------------------

    def _ensure(self) -> None:
        if self._ready:
            return
        try:
            for d in (self.blobs, self.drvs, self.roots_dir, self.guards, self.tmp, self.stamps):
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
            raise store_error(self.root, exc, "creating its directories") from exc
        self._ready = True

    @property
    def in_session(self) -> bool:
        """Whether this process holds a :meth:`session` of the store."""
        return self._session_depth > 0

    @contextlib.contextmanager
    def session(self) -> Iterator[Self]:
        """Hold the store against ``gc`` for the duration of the block (shared, re-entrant).

        Wrap a whole build in it, from the first lookup until the image's root is written:
        ``gc`` waits until no session is open, so nothing a build has made but not yet rooted is
        removed under it.
        """
        self._ensure()
        with self._mutex:
            if self._session_depth == 0:
                guard = FileGuard(self.guards / "gc.lock", shared=True, what="a store gc to finish")
                guard.__enter__()
                self._session_guard = guard
            self._session_depth += 1
        try:
            yield self
        finally:
            with self._mutex:
                self._session_depth -= 1
                if self._session_depth == 0 and self._session_guard is not None:
                    self._session_guard.__exit__(None, None, None)
                    self._session_guard = None

    def gc_guard(self) -> FileGuard:
        """The exclusive lock ``gc`` holds: it waits until every session has ended."""
        self._ensure()
        if self.in_session:
            raise StoreError("gc cannot run inside a session of the same store")
        return FileGuard(self.guards / "gc.lock", shared=False, what="running builds to finish")

    # -- blobs -------------------------------------------------------------------------------

    def blob_path(self, digest: str) -> Path:
        """Where the blob ``sha256:<hex>`` lives (whether or not it exists). Never write to it."""
        return self.blobs / digest_hex(digest)

    def has_blob(self, digest: str) -> bool:
        """Whether a regular file of that name is here (its bytes unchecked: see
        :meth:`check_blob`; a folder, fifo or symlink there is no blob)."""
        try:
            return stat.S_ISREG(self.blob_path(digest).lstat().st_mode)
        except FileNotFoundError:
            return False

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
                raise store_error(self.root, exc, "creating a temporary file") from exc
            tmp = Path(name)
            try:
                with os.fdopen(fd, "wb", buffering=0) as f:
                    writer = BlobWriter(self, f, tmp)
                    yield writer
                    try:
                        os.fsync(f.fileno())
                    except OSError as exc:
                        raise store_error(self.root, exc, "writing a blob") from exc
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
                    os.chmod(tmp, BLOB_MODE)
                    self._clear(final)
                    os.replace(tmp, final)
                    fsync_dir(self.blobs)
                except OSError as exc:
                    raise store_error(self.root, exc, "storing a blob") from exc
                self._stamped.record(hexd, final)  # its bytes were hashed just now
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
        with Path(path).open("rb") as src:
            return self.add_stream(src, expected=expected)

    def add_stream(self, src: Readable, *, expected: str | None = None) -> str:
        """Copy what ``src`` reads (to its end) into the store; returns its digest. When
        ``expected`` is given and already stored, nothing is read."""
        if expected is not None and self.check_blob(expected):
            return expected
        with self.blob_writer(expected=expected) as w:
            while chunk := src.read(CHUNK):
                w.write(chunk)
        return w.digest

    def read_blob(self, digest: str) -> bytes:
        """The bytes of a (small) blob, hashed on the way: a corrupt blob raises
        :class:`IntegrityError`."""
        try:
            with open_regular(self.blob_path(digest)) as f:
                data = f.read()
        except FileNotFoundError:
            raise StoreError(f"blob {digest} is not in the store {self.root}") from None
        if hashlib.sha256(data).hexdigest() != digest_hex(digest):
            raise self.corrupt_error(digest)
        return data

    def open_blob(self, digest: str) -> IO[bytes]:
        """The blob opened for reading (unchecked: check it first where that matters)."""
        try:
            return open_regular(self.blob_path(digest))
        except FileNotFoundError:
            raise StoreError(f"blob {digest} is not in the store {self.root}") from None

    # -- blob integrity ----------------------------------------------------------------------

    def check_blob(self, digest: str) -> bool:
        """Whether blob ``digest`` is here (a regular file) and its bytes hash to its name.
        Cheap when the blob's stat is what it was when its bytes were last hashed (see
        :mod:`envbuild.store.stamps`); otherwise the blob is hashed again now. A blob whose
        bytes are right but whose mode is not 0444 gets its mode back (a warning says so)."""
        self._ensure()
        hexd = digest_hex(digest)
        path = self.blobs / hexd
        if not self._stamped.check(hexd, path):
            return False
        self.restore_mode(path)
        return True

    def restore_mode(self, path: Path) -> bool:
        """Give the (checked) blob file ``path`` its mode 0444 again when it has another; True
        when it had to (with a warning: output folders hard-linking it had that mode too)."""
        try:
            mode = stat.S_IMODE(path.lstat().st_mode)
            if mode == BLOB_MODE:
                return False
            log.warning(
                "store blob %s had mode %04o, not %04o (other users could not read the output "
                "folders that link it): restored",
                path.name[:12], mode, BLOB_MODE,
            )  # fmt: skip
            os.chmod(path, BLOB_MODE, follow_symlinks=False)
        except OSError as exc:
            raise store_error(self.root, exc, f"restoring the mode of blob {path.name}") from exc
        self._stamped.record(path.name, path)  # the chmod changed its ctime, not its bytes
        return True

    def stamp(self, path: Path) -> None:
        """Note that the blob file ``path`` was hashed just now and matched its name."""
        self._stamped.record(path.name, path)

    def hash_file(self, path: Path) -> str:
        """The sha256 (hex) of the file at ``path``, read now."""
        return self._stamped.hash(path)

    def corrupt_error(self, digest: str, what: str = "") -> IntegrityError:
        """The :class:`IntegrityError` for a blob whose bytes no longer match its name."""
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
        self._stamped.linked(hexd, self.blobs / hexd)

    def drop_blob(self, digest: str) -> None:
        """Remove a (corrupt) blob, or whatever took its name (a folder too), and its stamp;
        what needs it is made or fetched again."""
        hexd = digest_hex(digest)
        self._stamped.forget(hexd)
        try:
            rmtree(self.blobs / hexd)
        except OSError as exc:
            raise store_error(self.root, exc, f"removing blob {hexd}") from exc

    def _clear(self, final: Path) -> None:
        """Make room for a blob at ``final`` when its name is taken by a folder (a rename cannot
        replace one); a file there is replaced by the rename itself."""
        try:
            if stat.S_ISDIR(final.lstat().st_mode):
                log.warning("store blob %s was a folder: replacing it", final.name[:12])
                rmtree(final)
        except FileNotFoundError:
            pass

    def stale_stamps(self, kept: set[str]) -> list[Path]:
        """The stamp files of blobs other than ``kept`` (hex digests)."""
        return self._stamped.stale(kept)

    # -- scratch space and small files -------------------------------------------------------

    @contextlib.contextmanager
    def temp_dir(self, prefix: str = "work-", *, session: bool = True) -> Iterator[Path]:
        """A scratch directory inside the store (same file system as the blobs), removed after
        the block; ``gc`` removes any that a killed process left behind. ``session=False`` for
        a caller that holds the gc lock itself (a session would wait for it)."""
        self._ensure()
        with (
            self.session() if session else contextlib.nullcontext(self),
            contextlib.ExitStack() as held,
        ):
            try:
                # locked while used: what a killed run left with this prefix, the next one
                # removes (and :meth:`sweep_temp`), not only gc
                path = held.enter_context(scratch.guarded_folder(self.tmp, prefix))
            except OSError as exc:
                raise store_error(self.root, exc, "creating a scratch directory") from exc
            yield path

    def sweep_temp(self, prefixes: tuple[str, ...]) -> int:
        """Remove the scratch folders of these prefixes that killed runs left (a run that is
        alive holds its folder locked). Returns how many."""
        if not self.tmp.is_dir():
            return 0
        return scratch.sweep_folders(self.tmp, prefixes)

    def _write_file(self, path: Path, data: bytes) -> None:
        """Atomically write a small metadata file (temp in tmp/, fsync, rename)."""
        tmp_dir = self.tmp if self.tmp.is_dir() else path.parent
        try:
            fd, name = tempfile.mkstemp(prefix="meta-", suffix=".tmp", dir=tmp_dir)
        except OSError as exc:
            raise store_error(self.root, exc, f"writing {path.name}") from exc
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(name, 0o644)
            os.replace(name, path)
        except OSError as exc:
            raise store_error(self.root, exc, f"writing {path.name}", tmp_dir) from exc
        finally:
            Path(name).unlink(missing_ok=True)
