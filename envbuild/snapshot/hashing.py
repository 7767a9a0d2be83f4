"""Parallel sha256 of many files, close to what the machine's cores can hash.

Big jobs run in a pool of forked processes, one per core: measured on a 16-core H200 machine,
threads stalled at ~1.7 GB/s (the GIL around each small file's open/read/close, and page faults of
one address space), far below the 17 GB/s the cores can hash. Files go largest first (sha256 of one
file is sequential, so the biggest file is the critical path) and small files in batches. Small
jobs, or a process that already runs other threads (fork would be unsafe), use threads. A FIFO is
opened non-blocking and never read.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import mmap
import multiprocessing as mp
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass

log = logging.getLogger("envbuild.snapshot.hashing")

BIG = 1 << 20
BATCH_BYTES = 8 << 20
BATCH_FILES = 256
#: Workers hashing at once; None: one per CPU. (The benchmark sweeps it.)
DEFAULT_WORKERS: int | None = None
#: "auto" (processes for big jobs), "threads" or "processes".
ENGINE = "auto"
PROCESS_MIN_BYTES = 256 << 20


@dataclass(frozen=True)
class FileHash:
    path: str
    size: int
    digest: bytes | None  # None when the file could not be read (see error)
    error: str | None = None
    missing: bool = False  # the error is that the path does not exist
    mtime_ns: int = 0


def failed(path: str, exc: OSError, size: int = 0) -> FileHash:
    gone = exc.errno in (errno.ENOENT, errno.ENOTDIR)
    return FileHash(path, size, None, exc.strerror or str(exc), missing=gone)


def stat_one(path: str) -> FileHash:
    """Size and mtime, no hash; the same errors as :func:`hash_one`."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return failed(path, exc)
    if not stat.S_ISREG(st.st_mode):
        return FileHash(path, st.st_size, None, "not a regular file")
    return FileHash(path, st.st_size, None, mtime_ns=st.st_mtime_ns)


def hash_one(path: str) -> FileHash:
    try:
        # O_NONBLOCK: opening a FIFO for reading must not wait for a writer.
        with open(
            os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb", buffering=0
        ) as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                return FileHash(path, st.st_size, None, "not a regular file")
            if st.st_size < BIG:
                digest = hashlib.sha256(f.read()).digest()
            else:  # mapped: no copy out of the page cache, and hashlib drops the GIL
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                    digest = hashlib.sha256(m).digest()
    except OSError as exc:
        return failed(path, exc)
    return FileHash(path, st.st_size, digest, mtime_ns=st.st_mtime_ns)


def _batches(items: Sequence[tuple[str, int]]) -> list[list[str]]:
    """Largest files first, each big file alone, small ones grouped."""
    ordered = sorted(items, key=lambda item: -item[1])
    out: list[list[str]] = []
    batch: list[str] = []
    batch_bytes = 0
    for path, size in ordered:
        if size >= BIG:
            out.append([path])
            continue
        batch.append(path)
        batch_bytes += size
        if len(batch) >= BATCH_FILES or batch_bytes >= BATCH_BYTES:
            out.append(batch)
            batch, batch_bytes = [], 0
    if batch:
        out.append(batch)
    return out


def _hash_batch(batch: list[str]) -> list[FileHash]:
    return [hash_one(p) for p in batch]


def _executor(workers: int, total: int) -> Executor:
    forkable = threading.active_count() == 1 and "fork" in mp.get_all_start_methods()
    wanted = ENGINE == "processes" or (ENGINE == "auto" and total >= PROCESS_MIN_BYTES)
    if workers > 1 and wanted and forkable:
        try:
            return ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("fork"))
        except OSError as exc:  # no /dev/shm, no semaphores: threads still work
            log.debug("no process pool (%s); hashing with threads", exc)
    return ThreadPoolExecutor(max_workers=workers)


def hash_files(
    items: Iterable[tuple[str, int]],
    *,
    workers: int | None = None,
    hasher: Callable[[str], FileHash] | None = None,
    meanwhile: Callable[[], object] | None = None,
) -> dict[str, FileHash]:
    """sha256 of each ``(path, expected_size)``; the size only orders the work. ``meanwhile``
    runs in this process while the workers hash (other work that needs no hash)."""
    listed = list(items)
    batches = _batches(listed)
    workers = workers or DEFAULT_WORKERS or os.cpu_count() or 1
    results: dict[str, FileHash] = {}
    if hasher is not None:
        one = hasher
        with ThreadPoolExecutor(max_workers=workers) as threads:
            pending = threads.map(lambda b: [one(p) for p in b], batches)
            if meanwhile is not None:
                meanwhile()
            for done in pending:
                results.update((fh.path, fh) for fh in done)
        return results
    with _executor(workers, sum(size for _, size in listed)) as pool:
        pending = pool.map(_hash_batch, batches)  # submits everything now
        if meanwhile is not None:
            meanwhile()
        for done in pending:
            results.update((fh.path, fh) for fh in done)
    return results


def sha256_limit(
    seconds: float = 2.0, *, buffer_mib: int = 64, workers: int = 1
) -> tuple[float, int]:
    """Bytes per second the machine's sha256 reaches on an in-memory buffer, with ``workers``
    threads hashing at once (each its own buffer). Returns (bytes/s, bytes hashed)."""
    buf = os.urandom(buffer_mib << 20)

    def one(deadline: float) -> int:
        done = 0
        while time.perf_counter() < deadline:
            hashlib.sha256(buf).digest()
            done += len(buf)
        return done

    start = time.perf_counter()
    deadline = start + seconds
    with ThreadPoolExecutor(max_workers=workers) as pool:
        total = sum(pool.map(one, [deadline] * workers))
    elapsed = time.perf_counter() - start
    return total / elapsed, total
