"""No child outlives envbuild: the children's table, their process groups, and the signals.

Every child starts through :func:`started`: in a process group of its own (what it starts, apt
under mmdebstrap, stays in it) and tracked until it has been waited for. The CLI runs a command
inside :func:`stopping_on_signals`: SIGTERM, SIGINT or SIGHUP then stop every child's group
(:func:`stop_children`: SIGTERM, SIGKILL after :data:`STOP_GRACE`), refuse new children, and
raise :class:`~envbuild.errors.Interrupted` in the main thread, so that the ``finally`` blocks
remove what the children left. :func:`thread_pool` drops the queued work of a pool on the way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import FrameType
from typing import Any

from envbuild.errors import Interrupted

log = logging.getLogger("envbuild.proc")


#: How long a stopped child's process group has to exit after SIGTERM before SIGKILL.
STOP_GRACE = 3.0
#: The signals that stop envbuild and its children (:func:`stopping_on_signals`).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Children:
    """The children this process started and has not waited for yet, and whether a signal is
    stopping it (then no new child starts)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # a signal's handler runs in the main thread, maybe inside
        self.live: dict[int, subprocess.Popen[Any]] = {}
        self.stopping: Interrupted | None = None
        self.owner = os.getpid()  # a forked worker inherits the table, not the children


_children = _Children()


@contextlib.contextmanager
def started(argv: Sequence[str], **popen: Any) -> Iterator[subprocess.Popen[Any]]:
    """Start ``argv`` (``popen``: :class:`subprocess.Popen`'s arguments) in a process group of
    its own, tracked until it has been waited for; an exception in the block stops its group
    (SIGTERM, then SIGKILL) before it is waited for. Raises the stopping signal's
    :class:`Interrupted` instead of starting anything once a signal is stopping envbuild."""
    with _children.lock:
        if _children.stopping is not None:
            raise _children.stopping
        child = subprocess.Popen(argv, process_group=0, **popen)
        _children.live[child.pid] = child
    try:
        with child:  # closes its pipes and waits for it
            try:
                yield child
            except BaseException:
                if child.poll() is None or _group_alive(child.pid):  # or what it started
                    _stop([child])
                raise
    finally:
        with _children.lock:
            _children.live.pop(child.pid, None)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _running_groups(groups: Sequence[int]) -> set[int]:
    """Which of the process groups ``groups`` still have a member that is not a zombie (an
    orphan's zombie waits for init to reap it, which may take a while in a container)."""
    wanted, running = set(groups), set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) in wanted and fields[0] not in (b"Z", b"X"):
            running.add(int(fields[2]))
    return running


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _stop(children: Sequence[subprocess.Popen[Any]], grace: float = STOP_GRACE) -> None:
    """SIGTERM to each child's process group, SIGKILL to what is left of them after ``grace``
    seconds; returns once nothing of them runs (the children reaped here or by their owner)."""
    groups = [c.pid for c in children]  # each child leads its own group (started)
    for pgid in groups:
        _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while True:
        for child in children:
            child.poll()  # reaps a leader that exited
        left = _running_groups(groups)
        if not left:
            break
        if time.monotonic() >= deadline:
            for pgid in sorted(left):
                log.warning("process group %d did not stop within %.0f s: killed", pgid, grace)
                _signal_group(pgid, signal.SIGKILL)
            break
        time.sleep(0.02)
    for child in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=grace)


def stop_children(reason: Interrupted) -> None:
    """Stop every child this process started (and refuse new ones with ``reason``)."""
    with _children.lock:
        if _children.stopping is None:
            _children.stopping = reason
        children = list(_children.live.values())
    if children:
        log.info("stopping %d child process(es): %s", len(children), reason.name)
        _stop(children)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    reason = Interrupted(signum, signal.Signals(signum).name)
    if os.getpid() != _children.owner:  # a forked worker (snapshot's hashing): its parent stops it
        raise reason
    first = _children.stopping is None
    stop_children(reason)
    if first:  # a second signal while envbuild cleans up only stops what started since
        raise reason


@contextlib.contextmanager
def thread_pool(max_workers: int, **options: Any) -> Iterator[ThreadPoolExecutor]:
    """A :class:`ThreadPoolExecutor` (``options``: its other arguments) that, left by an
    exception (a signal's :class:`Interrupted` in the main thread), drops the work still
    queued and waits only for the tasks under way: a ``with ThreadPoolExecutor()`` block runs
    every queued task first (hashing 500 GB of model files after a SIGTERM)."""
    pool = ThreadPoolExecutor(max_workers=max_workers, **options)
    try:
        yield pool
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


@contextlib.contextmanager
def stopping_on_signals() -> Iterator[None]:
    """While the block runs, SIGTERM, SIGINT and SIGHUP stop every child (:func:`stop_children`)
    and raise :class:`Interrupted` in the main thread (the CLI exits with 128 + the signal).
    A signal ignored when envbuild started (``nohup``, a background job's SIGINT) stays ignored;
    outside the main thread nothing is installed (Python delivers signals to it alone)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for signum in STOP_SIGNALS:
        old = signal.getsignal(signum)
        if old is not signal.SIG_IGN:
            previous[signum] = old
            signal.signal(signum, _on_signal)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
        with _children.lock:
            _children.stopping = None
