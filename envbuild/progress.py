"""How long steps report progress without printing.

The core calls :meth:`Progress.task` and advances the returned :class:`Task`; the CLI passes an
implementation that draws bars (rich, on a terminal) or none at all. The default does nothing.
"""

from __future__ import annotations

import threading
from types import TracebackType


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
