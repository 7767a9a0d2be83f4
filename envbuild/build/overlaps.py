"""Overlaps: distributions of one image that install the same path, found from their wheels'
RECORDs before anything is installed, and settled by the spec's ``[image.overlaps]``.

Input: the locked wheels and the spec's rules; output: the report the build manifest records
and, per losing distribution, the paths its layer leaves out. The report is a store derivation
of the wheel set and the rules, so a no-op rebuild does not read the wheels.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from packaging.utils import canonicalize_name

from envbuild.build.fetch import fetch_wheels
from envbuild.build.install import (
    INSTALL_FORMAT,
    VenvTarget,
    WheelRef,
    find_overlaps,
    resolve_overlaps,
    wheel_files,
)
from envbuild.fsio import canonical_json
from envbuild.progress import Progress
from envbuild.spec import LoadedSpec
from envbuild.store.core import Output, Store

log = logging.getLogger(__name__)


def overlap_report(
    loaded: LoadedSpec,
    wheels: list[WheelRef],
    store: Store,
    target: VenvTarget,
    progress: Progress,
    kept: list[str],
) -> tuple[list[dict[str, Any]], dict[str, frozenset[str]]]:
    """Compare every wheel's RECORD before anything is installed (a derivation of the wheel set
    and the spec's rules, so a no-op rebuild does not read the wheels). An overlap the spec does
    not settle is an error naming both distributions and the paths."""
    rules: dict[str, str] = {
        canonicalize_name(k): canonicalize_name(v) for k, v in loaded.spec.image.overlaps.items()
    }
    inputs = {
        "wheels": sorted(w.sha256 for w in wheels),
        "rules": rules,
        "site_packages": target.site_packages,
        "install_format": INSTALL_FORMAT,
    }

    def builder() -> Output:
        blobs = fetch_wheels(wheels, store, progress=progress)
        files = {w.canonical: wheel_files(blobs[w.sha256], target) for w in wheels}
        resolved, remove = resolve_overlaps(find_overlaps(files), rules)
        report = {
            "overlaps": [ov.as_dict() for ov in resolved],
            "leaves_out": {k: sorted(v) for k, v in sorted(remove.items())},
        }
        return Output(outputs={"report": store.add_bytes(canonical_json(report).encode())})

    drv = store.build("overlaps", inputs, builder).drv
    kept.append(drv.key)
    report = json.loads(store.read_blob(drv.outputs["report"]))
    leaves = {k: frozenset(v) for k, v in report["leaves_out"].items()}
    return list(report["overlaps"]), leaves
