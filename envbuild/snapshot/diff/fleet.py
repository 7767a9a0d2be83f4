"""N snapshots at once: one table of what differs between machines.

The rule of "the same" is the pairwise one, :func:`~.compare.compare`, and nothing else: a row
(group, subject) is in the table exactly when at least one pair of machines differs there. The
machines are first sorted into classes of equal counted facts (a fleet is mostly identical
machines, the hostname and free disk aside), so only one machine of each class is compared with
one of every other class; pairs are taken in the order of their labels, so the rows do not
depend on the order the files were given in. Two environments at other paths that compare pairs
are named by the lesser path. Volatile state (free disk, GPU memory in use, hostname) does not
count, as in ``diff``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

from envbuild.snapshot.diff.compare import compare, group_order, load_side, unmatched_envs
from envbuild.snapshot.diff.facts import Fact, Side

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Row:
    """One subject on which at least two machines differ: each machine's value (None: it has
    none), in the order the machines were given."""

    group: str
    title: str
    subject: str
    values: tuple[str | None, ...]


@dataclass
class FleetResult:
    machines: list[str]
    rows: list[Row]
    notes: list[str] = field(default_factory=list)
    not_compared: list[str] = field(default_factory=list)

    @property
    def different(self) -> bool:
        return bool(self.rows)

    def as_dict(self) -> dict[str, Any]:
        return {
            "machines": self.machines,
            "different": self.different,
            "rows": [
                {"group": r.group, "title": r.title, "subject": r.subject, "values": list(r.values)}
                for r in self.rows
            ],
            "notes": self.notes,
            "not_compared": self.not_compared,
        }


def _copy(side: Side) -> Side:
    # compare() pairs environments by renaming groups of its second side: give it its own dict
    return Side(side.label, side.kind, dict(side.groups))


def compare_fleet(sides: Sequence[Side]) -> FleetResult:
    """The rows where the machines ``sides`` differ, pair by pair under :func:`compare`."""
    order = sorted(range(len(sides)), key=lambda i: sides[i].label)
    classes: list[list[int]] = []  # machines of equal facts; the first one stands for them
    for i in order:
        for members in classes:
            if _same_facts(sides[members[0]], sides[i]):
                members.append(i)
                break
        else:
            classes.append([i])
    found: dict[tuple[str, str], tuple[str, dict[int, str | None]]] = {}
    notes: list[str] = []
    not_compared: list[str] = []
    for ca, cb in combinations(classes, 2):
        if _named_by_right(sides[ca[0]], sides[cb[0]]):
            ca, cb = cb, ca
        result = compare(_copy(sides[ca[0]]), _copy(sides[cb[0]]))
        notes += [n for n in result.notes if n not in notes]
        not_compared += [n for n in result.not_compared if n not in not_compared]
        for group in result.groups:
            if not group.counts:
                continue
            for change in group.changes:
                title, values = found.setdefault((group.key, change.subject), (group.title, {}))
                for members, value in ((ca, change.before), (cb, change.after)):
                    for m in members:
                        values.setdefault(m, value)
    rows = []
    for (key, subject), (title, values) in sorted(
        found.items(), key=lambda kv: (group_order(kv[0][0]), kv[0][1])
    ):
        shown = tuple(
            values[m] if m in values else _own_value(sides[m], key, subject)
            for m in range(len(sides))
        )
        rows.append(Row(key, title, subject, shown))
    return FleetResult([s.label for s in sides], rows, notes, not_compared)


def _counted(side: Side) -> dict[str, tuple[str, bool, dict[str, Fact]]]:
    return {key: group for key, group in side.groups.items() if group[1]}


def _same_facts(a: Side, b: Side) -> bool:
    """Whether ``a`` and ``b`` hold the same facts in every group that counts (state, such as
    the hostname, never makes a row), down to the fields compare() also reads (a fact's
    ``item`` and ``data``, which its equality leaves out): then they differ in no row."""
    groups_a, groups_b = _counted(a), _counted(b)
    if a.kind != b.kind or groups_a != groups_b:
        return False
    return all(
        fact.item == groups_b[key][2][subject].item and fact.data == groups_b[key][2][subject].data
        for key, (_, _, facts) in groups_a.items()
        for subject, fact in facts.items()
    )


def _named_by_right(a: Side, b: Side) -> bool:
    """Whether two environments at other paths would pair with ``b``'s the lesser path: then
    ``b`` goes on the left, so a paired group is named by the lesser path whichever machine is
    compared with which (and whichever stands for its class)."""
    only_a, only_b = unmatched_envs(a, b)
    return len(only_a) == 1 == len(only_b) and min(only_b) < min(only_a)


def _own_value(side: Side, key: str, subject: str) -> str | None:
    """A machine that differs from no other on this row (it did not record a fact that is
    unknown then, such as a setting): its own fact, if any."""
    fact = side.groups.get(key, ("", True, {}))[2].get(subject)
    return fact.text if fact is not None else None


def fleet_files(paths: Sequence[Path]) -> FleetResult:
    """Read every snapshot (or build manifest) first, then compare them as a fleet."""
    return compare_fleet([load_side(p)[0] for p in paths])
