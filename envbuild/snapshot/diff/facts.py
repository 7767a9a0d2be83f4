"""The vocabulary of a diff: a :class:`Fact` (what one side says about one subject) and a
:class:`Side` (one input reduced to groups of facts), and the texts sizes and flags are shown as."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

ABSENT = "∅"


@dataclass(frozen=True)
class Fact:
    """What one side says about one subject; two facts of a subject are compared."""

    text: str
    size: int | None = None
    detail: str | None = None  # compared too, shown when the text is the same
    digest: str | None = None  # compared when both sides know it (a quick check may not)
    item: dict[str, Any] | None = field(default=None, compare=False)  # what it is, as fields
    data: dict[str, Any] | None = field(default=None, compare=False)  # its state, as fields


@dataclass
class Side:
    """One input reduced to facts: group key → (title, counts, subject → fact)."""

    label: str
    kind: str  # "snapshot" or "build manifest"
    groups: dict[str, tuple[str, bool, dict[str, Fact]]] = field(default_factory=dict)

    def put(self, key: str, title: str, subject: str, fact: Fact, *, counts: bool = True) -> None:
        self.groups.setdefault(key, (title, counts, {}))[2][subject] = fact

    def group(self, key: str, title: str, *, counts: bool = True) -> None:
        self.groups.setdefault(key, (title, counts, {}))


def size_text(n: int) -> str:
    """Bytes as people read them (1.5 GiB), as every diff line shows them."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError  # pragma: no cover


def count_text(value: int | None) -> str:
    """A count, or n/a when it is not known."""
    return "n/a" if value is None else str(value)


def flag_text(value: bool | None) -> str:
    """on/off, or n/a when it is not known."""
    return "n/a" if value is None else ("on" if value else "off")
