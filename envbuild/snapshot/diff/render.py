"""A diff as text: each group's title, one line per change (before → after, and the size
delta), then the notes and what was not compared."""

from __future__ import annotations

import logging

from envbuild.snapshot.diff.compare import DiffResult
from envbuild.snapshot.diff.facts import ABSENT, size_text

log = logging.getLogger(__name__)


def render_text(result: DiffResult, *, only_counted: bool = False) -> list[str]:
    """One line per change under its group's title, then the notes (``only_counted``: without
    the groups that do not count, such as the volatile state)."""
    lines: list[str] = []
    for group in result.groups:
        if not group.changes or (only_counted and not group.counts):
            continue
        lines.append(f"{group.title}:")
        for c in group.changes:
            text = f"  {c.subject}: {c.before or ABSENT} → {c.after or ABSENT}"
            if c.delta_bytes:
                sign = "+" if c.delta_bytes > 0 else "-"
                text += f", {sign}{size_text(abs(c.delta_bytes))}"
            lines.append(text)
    for note in result.notes:
        lines.append(f"note: {note}")
    for info in result.info:
        lines.append(f"info: {info}")
    for note in result.not_compared:
        lines.append(f"not compared: {note}")
    return lines
