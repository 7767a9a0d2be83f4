"""Looking at many files in parallel, close to what the machine's cores can hash.

:func:`run_jobs` runs jobs in a pool of forked processes, one per core, or in threads. Big jobs
fork: measured on a 16-core H200 machine, threads stalled at ~1.7 GB/s (the GIL around each
small file's open/read/close, and page faults of one address space), far below the 17 GB/s the
cores can hash. The children inherit the jobs and take their numbers from a pipe, first come
first served; the caller orders them costliest first (longest-processing-time-first
scheduling). Small jobs, or a process that already runs other threads (fork would be unsafe),
use threads. :func:`hash_one` uses bare file descriptors (one ``read`` of a small file, a
mapping of a big one); a FIFO is opened non-blocking and never read. :func:`hash_files` hashes a
list of paths, big files alone and small ones in batches.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import mmap
import os
import pickle
import signal
import stat
import struct
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import IO, NamedTuple, TypeVar

from envbuild.proc import core as proc

log = logging.getLogger(__name__)

BIG = 1 << 20
BATCH_BYTES = 8 << 20
BATCH_FILES = 256
#: Workers hashing at once; None: one per CPU. (The benchmark sweeps it.)
DEFAULT_WORKERS: int | None = None
#: "auto" (processes for big jobs), "threads" or "processes".
ENGINE = "auto"
PROCESS_MIN_BYTES = 256 << 20
#: Stat-only looks fork for this many files or more (a stat costs ~5 µs).
PROCESS_MIN_FILES = 20_000


class FileHash(NamedTuple):
    """What one look at a file found (a tuple: hundreds of thousands cross a process pipe)."""

    path: str
    size: int
    digest: bytes | None  # None when the file could not be read (see error)
    error: str | None = None
    missing: bool = False  # the error is that the path does not exist
    mtime_ns: int = 0
    mode: int = 0  # the permission bits (stat.S_IMODE); 0 when it could not be looked at


def failed(path: str, exc: OSError, size: int = 0) -> FileHash:
    gone = exc.errno in (errno.ENOENT, errno.ENOTDIR)
    return FileHash(path, size, None, exc.strerror or str(exc), missing=gone)


def _not_a_path(path: str) -> FileHash:
    # a RECORD is untrusted: a NUL byte in a path is a finding, not a crash of the check
    return FileHash(path, 0, None, "not a file name (it holds a NUL byte)", missing=True)


def stat_one(path: str) -> FileHash:
    """Size and mtime, no hash; the same errors as :func:`hash_one`."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return failed(path, exc)
    except ValueError:
        return _not_a_path(path)
    if not stat.S_ISREG(st.st_mode):
        return FileHash(path, st.st_size, None, "not a regular file")
    return FileHash(path, st.st_size, None, mtime_ns=st.st_mtime_ns, mode=stat.S_IMODE(st.st_mode))


_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC  # O_NONBLOCK: a FIFO never waits


def hash_one(path: str, buffer: bytearray | None = None) -> FileHash:
    """sha256 of the file at ``path``. A small file is read in one call, into ``buffer`` when
    given (a reused buffer of at least ``BIG + 1`` bytes: no allocation, so no fresh pages to
    fault in for each file); a big one is mapped."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        return failed(path, exc)
    except ValueError:
        return _not_a_path(path)
    try:
        st = os.fstat(fd)
        size = st.st_size
        if not stat.S_ISREG(st.st_mode):
            return FileHash(path, size, None, "not a regular file")
        if size < BIG:
            # one call: a regular file's short read is its end
            if buffer is not None:
                view = memoryview(buffer)[: size + 1]
                got = os.readv(fd, [view])
                data: bytes | memoryview = view[:got]
            else:
                data = os.read(fd, size + 1)
            if len(data) != size:  # it changed since fstat (or a short read): read to the end
                data = bytes(data) + b"".join(iter(lambda: os.read(fd, BIG), b""))
            digest = hashlib.sha256(data).digest()
        else:  # mapped: no copy out of the page cache, and hashlib drops the GIL
            with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as m:
                digest = hashlib.sha256(m).digest()
    except OSError as exc:
        return failed(path, exc)
    finally:
        os.close(fd)
    return FileHash(path, size, digest, None, False, st.st_mtime_ns, stat.S_IMODE(st.st_mode))


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


def _hash_batch(batch: list[str], buffer: bytearray | None = None) -> list[FileHash]:
    buffer = buffer if buffer is not None else bytearray(BIG + 1)
    return [hash_one(p, buffer) for p in batch]


def _stat_batch(batch: list[str], buffer: bytearray | None = None) -> list[FileHash]:
    return [stat_one(p) for p in batch]


def forkable() -> bool:
    """Whether this process may fork workers: only while it runs no other thread."""
    return threading.active_count() == 1 and hasattr(os, "fork")


def use_processes(workers: int, total: int, files: int = 0, *, stat_only: bool = False) -> bool:
    big = files >= PROCESS_MIN_FILES if stat_only else total >= PROCESS_MIN_BYTES
    wanted = ENGINE == "processes" or (ENGINE == "auto" and big)
    return workers > 1 and wanted and forkable()


J = TypeVar("J")
R = TypeVar("R")
#: One job's work: ``(job, buffer)``, the buffer a reusable ``BIG + 1`` bytes (None in threads).
Work = Callable[[J, "bytearray | None"], R]


def _worker(jobs: Sequence[J], work: Work[J, R], tickets: int, out: IO[bytes]) -> None:
    """In a forked child: take job numbers from the ``tickets`` pipe until it is empty, and
    pickle each job's number and result into ``out``."""
    done: list[tuple[int, R]] = []
    buffer = bytearray(BIG + 1)
    while len(ticket := os.read(tickets, 4)) == 4:  # a pipe read of 4 bytes is atomic
        (number,) = struct.unpack("=I", ticket)
        done.append((number, work(jobs[number], buffer)))
    pickle.dump(done, out, protocol=pickle.HIGHEST_PROTOCOL)
    out.flush()


def _in_processes(
    jobs: Sequence[J], work: Work[J, R], workers: int, meanwhile: Callable[[], object] | None
) -> list[R]:
    """Run ``work`` on each of ``jobs`` (in this order, each taken by the first free worker)
    in ``workers`` forked children. The children inherit the jobs (nothing is pickled on the
    way in), take job numbers from a pipe written before the fork, and leave their results in
    a temporary file each, so they never wait for this process, which runs ``meanwhile``."""
    tickets, feed = os.pipe()
    outs: list[IO[bytes]] = []
    children: list[int] = []
    files = contextlib.ExitStack()
    try:
        with contextlib.suppress(OSError):  # room for every ticket (a pipe is 64 KiB at first)
            fcntl.fcntl(feed, fcntl.F_SETPIPE_SZ, max(4 * len(jobs), 4096))
        os.set_blocking(feed, False)
        numbers = b"".join(struct.pack("=I", i) for i in range(len(jobs)))
        if os.write(feed, numbers) != len(numbers):
            raise BlockingIOError("the ticket pipe is too small")
        os.close(feed)
        feed = -1
        for _ in range(min(workers, len(jobs))):
            outs.append(files.enter_context(tempfile.TemporaryFile()))  # noqa: SIM115 (closed by files)
            pid = os.fork()
            if pid == 0:  # the child: never returns
                code = 1
                try:
                    _worker(jobs, work, tickets, outs[-1])
                    code = 0
                except BaseException:
                    traceback.print_exc()
                finally:
                    os._exit(code)
            children.append(pid)
        if meanwhile is not None:
            meanwhile()
        failed = [pid for pid in children if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])]
        children = []
        if failed:
            raise OSError(f"{len(failed)} hashing worker(s) failed")
        results: list[R | None] = [None] * len(jobs)
        for left in outs:
            left.seek(0)
            for number, result in pickle.load(left):
                results[number] = result
        return results  # type: ignore[return-value]  # every ticket was taken: no None left
    finally:
        for pid in children:  # only after an error here
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        files.close()
        os.close(tickets)
        if feed >= 0:
            os.close(feed)


def run_jobs(
    jobs: Sequence[J],
    work: Work[J, R],
    *,
    workers: int,
    processes: bool,
    meanwhile: Callable[[], object] | None = None,
) -> list[R]:
    """``work(job, buffer)`` for each job, in forked processes (``processes``: the caller has
    checked :func:`forkable`) or in threads; ``meanwhile`` runs in this process while they do.
    Results come back in the jobs' order."""
    if processes:
        return _in_processes(jobs, work, workers, meanwhile)
    with proc.thread_pool(workers) as threads:  # a signal drops the files not started
        pending = threads.map(lambda job: work(job, None), jobs)  # submits everything now
        if meanwhile is not None:
            meanwhile()
        return list(pending)


def hash_files(
    items: Iterable[tuple[str, int]],
    *,
    workers: int | None = None,
    meanwhile: Callable[[], object] | None = None,
    stat_only: bool = False,
) -> dict[str, FileHash]:
    """sha256 of each ``(path, expected_size)``; the size only orders the work. ``meanwhile``
    runs in this process while the workers hash (other work that needs no hash). ``stat_only``
    looks at sizes and mtimes only (:func:`stat_one`)."""
    listed = list(items)
    batches = _batches(listed)
    workers = workers or DEFAULT_WORKERS or os.cpu_count() or 1
    total = sum(size for _, size in listed)
    look = _stat_batch if stat_only else _hash_batch

    def fields(batch: list[str], buffer: bytearray | None) -> list[tuple[object, ...]]:
        # the fields after the path: the parent has the paths, and not pickling them back
        # halves what it has to unpickle
        return [fh[1:] for fh in look(batch, buffer)]

    processes = use_processes(workers, total, len(listed), stat_only=stat_only)
    found_fields = run_jobs(
        batches, fields, workers=workers, processes=processes, meanwhile=meanwhile
    )
    make = tuple.__new__  # FileHash._make, without its per-call checks
    return {
        path: make(FileHash, (path, *got))
        for batch, done in zip(batches, found_fields, strict=True)
        for path, got in zip(batch, done, strict=True)
    }


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
