"""Overlaps: distributions of one image that install the same path, found from their wheels'
RECORDs before anything is installed, and settled by the spec's ``[image.overlaps]``.

Input: the locked wheels and the spec's rules; output: the report the build manifest records
and, per losing distribution, the paths its layer leaves out. The report is a store derivation
of the wheel set and the rules, so a no-op rebuild does not read the wheels.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from packaging.utils import canonicalize_name

from envbuild.build.fetch import fetch_wheels
from envbuild.build.install import INSTALL_FORMAT
from envbuild.errors import OverlapError
from envbuild.fsio import canonical_json
from envbuild.installed.venv import VenvTarget
from envbuild.installed.wheelpaths import wheel_files
from envbuild.lock.wheels import WheelRef
from envbuild.spec import LoadedSpec
from envbuild.store.core import Output, Store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Overlap:
    """Two distributions that install the same paths (with different bytes)."""

    first: str
    second: str
    paths: tuple[str, ...]
    winner: str | None = None

    def as_dict(self) -> dict[str, object]:
        """The overlap as the build manifest records it."""
        return {
            "distributions": [self.first, self.second],
            "paths": list(self.paths),
            "winner": self.winner,
        }


def find_overlaps(files: Mapping[str, Mapping[str, str]]) -> list[Overlap]:
    """Pairs of distributions that install one path with different (or unknown) content.

    ``files`` maps a distribution name to :func:`wheel_files`' answer. The same path with the same
    RECORD hash in both (an empty namespace ``__init__.py``) is not an overlap: order cannot
    change the bytes.
    """
    owners: dict[str, list[tuple[str, str]]] = {}
    for dist in sorted(files):
        for path, digest in files[dist].items():
            owners.setdefault(path, []).append((dist, digest))
    pairs: dict[tuple[str, str], list[str]] = {}
    for path, who in owners.items():
        for i, (a, ha) in enumerate(who):
            for b, hb in who[i + 1 :]:
                if ha and ha == hb:
                    continue
                pairs.setdefault((a, b), []).append(path)
    return [Overlap(a, b, tuple(sorted(paths))) for (a, b), paths in sorted(pairs.items())]


def resolve_overlaps(
    overlaps: Sequence[Overlap], rules: Mapping[str, str]
) -> tuple[list[Overlap], dict[str, frozenset[str]]]:
    """Apply the spec's ``[image.overlaps]`` (``loser = winner``).

    Returns the overlaps with their winner, and for each losing distribution the paths to leave
    out of its layer. Raises :class:`OverlapError` for every pair no rule settles.
    """
    norm = {canonicalize_name(k): canonicalize_name(v) for k, v in rules.items()}
    resolved: list[Overlap] = []
    unresolved: list[Overlap] = []
    remove: dict[str, set[str]] = {}
    for ov in overlaps:
        a, b = canonicalize_name(ov.first), canonicalize_name(ov.second)
        winner = None
        if norm.get(a) == b:
            winner = ov.second
        elif norm.get(b) == a:
            winner = ov.first
        if winner is None:
            unresolved.append(ov)
            continue
        loser = ov.second if winner == ov.first else ov.first
        remove.setdefault(loser, set()).update(ov.paths)
        resolved.append(Overlap(ov.first, ov.second, ov.paths, winner))
    if unresolved:
        raise OverlapError(unresolved)
    return resolved, {k: frozenset(v) for k, v in remove.items()}


def overlap_report(
    loaded: LoadedSpec,
    wheels: list[WheelRef],
    store: Store,
    target: VenvTarget,
) -> tuple[list[dict[str, Any]], dict[str, frozenset[str]], str]:
    """Compare every wheel's RECORD before anything is installed (a derivation of the wheel set
    and the spec's rules, so a no-op rebuild does not read the wheels): the overlaps, the paths
    each distribution leaves out, and the derivation's key. An overlap the spec does not settle
    is an error naming both distributions and the paths."""
    rules: dict[str, str] = {
        canonicalize_name(k): canonicalize_name(v) for k, v in loaded.spec.image.overlaps.items()
    }
    inputs = {
        "wheels": sorted(w.sha256 for w in wheels),
        "rules": rules,
        "site_packages": target.site_packages,
        "install_format": INSTALL_FORMAT,
    }

    def produce() -> Output:
        blobs = fetch_wheels(wheels, store)
        files = {w.canonical: wheel_files(blobs[w.sha256], target) for w in wheels}
        resolved, remove = resolve_overlaps(find_overlaps(files), rules)
        report = {
            "overlaps": [ov.as_dict() for ov in resolved],
            "leaves_out": {k: sorted(v) for k, v in sorted(remove.items())},
        }
        return Output(outputs={"report": store.add_bytes(canonical_json(report).encode())})

    drv = store.realize("overlaps", inputs, produce).drv
    report = json.loads(store.read_blob(drv.outputs["report"]))
    leaves = {k: frozenset(v) for k, v in report["leaves_out"].items()}
    return list(report["overlaps"]), leaves, drv.key
