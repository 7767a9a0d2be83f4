"""A diff as text: each group's title, one line per change (before → after, and the size
delta), then the notes and what was not compared; a fleet's rows, each value with its machines."""

from __future__ import annotations

import logging

from envbuild.snapshot.diff.compare import DiffResult
from envbuild.snapshot.diff.facts import ABSENT, size_text
from envbuild.snapshot.diff.fleet import FleetResult

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


#: a value more machines have than this is shown with their count ("the other 45 machines")
#: when it is the most common one: every machine that differs from them is named
NAMED_AT_MOST = 3


def render_fleet(result: FleetResult) -> list[str]:
    """Each row under its group's title: every value found, with the machines that have it
    (values in the order their first machine was given; the most common one last, by count,
    when more than :data:`NAMED_AT_MOST` machines have it)."""
    lines: list[str] = []
    title = None
    for row in result.rows:
        if row.title != title:
            title = row.title
            lines.append(f"{title}:")
        lines.append(f"  {row.subject}:")
        holders: dict[str, list[str]] = {}
        for machine, value in zip(result.machines, row.values, strict=True):
            holders.setdefault(value or ABSENT, []).append(machine)
        width = max(len(v) for v in holders)
        common = max(holders, key=lambda v: len(holders[v]))
        counted = len(holders[common]) > NAMED_AT_MOST
        for value, machines in holders.items():
            if not (counted and value == common):
                lines.append(f"    {value.ljust(width)}  on {', '.join(machines)}")
        if counted:
            lines.append(f"    {common.ljust(width)}  on the other {len(holders[common])} machines")
    for note in result.notes:
        lines.append(f"note: {note}")
    for note in result.not_compared:
        lines.append(f"not compared: {note}")
    return lines
