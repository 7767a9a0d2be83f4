"""One apply at a time: ``flock(2)`` on the state dir's lock file.

A second apply, rollback or gc waits up to ``wait`` seconds for the first, then refuses with the
holder's pid. The kernel drops the lock when its holder dies, so a killed apply never leaves the
machine locked.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from envbuild.apply.paths import Paths
from envbuild.errors import Busy, OutputError

log = logging.getLogger(__name__)

POLL = 0.2


@contextmanager
def state_guard(paths: Paths, *, wait: float = 0.0, what: str = "apply") -> Iterator[None]:
    try:
        paths.state.mkdir(parents=True, exist_ok=True)
        fd = os.open(paths.guard_file, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise OutputError(
            f"cannot open {paths.guard_file}: {exc.strerror or exc}",
            hint="run as a user who may write the state dir (root on a real machine)",
        ) from exc
    try:
        deadline = time.monotonic() + max(wait, 0.0)
        announced = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _holder(fd)
                if time.monotonic() >= deadline:
                    waited = f" after waiting {wait:.0f} s" if wait > 0 else ""
                    raise Busy(
                        f"another envbuild ({holder}) is changing {paths.state}{waited}",
                        hint="wait for it to finish, or rerun with --wait SECONDS",
                    ) from None
                if not announced:
                    log.info("waiting up to %.0f s for another envbuild (%s)", wait, holder)
                    announced = True
                time.sleep(POLL)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {what}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode(errors="replace").split()
    except OSError:
        return "pid unknown"
    if len(text) >= 2:
        return f"pid {text[0]}, {text[1]}"
    return "pid unknown"
