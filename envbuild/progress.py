"""How long steps report progress without printing.

The core calls :func:`task` and advances the returned :class:`Task`; the CLI sets, for the
length of a command, a :class:`Progress` that draws bars (rich, on a terminal) with
:func:`reporting`. It is a context variable, not a parameter every stage passes on; a thread
pool's threads start with an empty context, so what a pool runs goes through :func:`carried`.
Without one set, nothing is shown.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


class Task:
    """One unit of work with an optional total (bytes or items). Thread-safe; a context manager."""

    def __init__(self, description: str, total: int | None = None, *, unit: str = "B") -> None:
        self.description = description
        self.total = total
        self.unit = unit
        self.completed = 0
        self._lock = threading.Lock()

    def advance(self, amount: int = 1) -> None:
        with self._lock:
            self.completed += amount
        self._update()

    def done(self) -> None:
        """Called once when the work ends (also on error)."""

    def _update(self) -> None:
        """Hook for subclasses that draw."""

    def __enter__(self) -> Task:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.done()


class Progress:
    """Makes tasks. This base class shows nothing; the CLI subclasses it."""

    def task(self, description: str, total: int | None = None, *, unit: str = "B") -> Task:
        return Task(description, total, unit=unit)


NULL = Progress()


_current: contextvars.ContextVar[Progress] = contextvars.ContextVar("progress", default=NULL)


@contextmanager
def reporting(progress: Progress) -> Iterator[Progress]:
    """``progress`` makes the tasks :func:`task` starts in this context until the block ends."""
    token = _current.set(progress)
    try:
        yield progress
    finally:
        _current.reset(token)


def task(description: str, total: int | None = None, *, unit: str = "B") -> Task:
    """A task of the :class:`Progress` this context reports to (see :func:`reporting`)."""
    return _current.get().task(description, total, unit=unit)


def carried(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` to run in another thread (a pool's) with a copy of this thread's context, so
    that it reports to the same :class:`Progress`. One copy per call: a context runs in one
    thread at a time."""
    context = contextvars.copy_context()

    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        return context.run(fn, *args, **kwargs)

    return run
