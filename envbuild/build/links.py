"""The links stage: the image's link check (:mod:`envbuild.linkcheck`) as a store derivation.

Input: the plan's wheels, the base's layers and the venv target; output: the check's report,
kept in the store under a key of those inputs, so a no-op rebuild only reads the report. A
finding the spec does not accept in ``[image.link_findings]`` stops the build (exit 2).
"""

from __future__ import annotations

import json
import logging

from envbuild import progress
from envbuild.build.fetch import fetch_wheels
from envbuild.build.layerbuild import LayerInputs
from envbuild.build.manifest import BaseResult
from envbuild.build.plan import Plan
from envbuild.errors import LinkFindings
from envbuild.fsio import canonical_json
from envbuild.linkcheck import core as linkcheck
from envbuild.linkcheck.wheels import Wheel, check_image
from envbuild.spec import LoadedSpec
from envbuild.store.core import Output

log = logging.getLogger(__name__)

#: Bumped when what the link check finds for the same wheels and base changes.
LINKCHECK_FORMAT = 1


def link_check(loaded: LoadedSpec, plan: Plan, base: BaseResult, wheels: LayerInputs) -> str:
    """The link check of the image: a derivation of its wheels and base, so a no-op rebuild
    only reads its report. Returns the derivation's key (the output folder's root keeps it). A
    finding the spec does not accept in ``[image.link_findings]`` raises
    :class:`~envbuild.errors.LinkFindings`; the layers made stay in the store. The wheels not
    fetched yet (the store had their layers) are fetched into ``wheels.blobs``."""
    store, blobs, by_sha = wheels.store, wheels.blobs, wheels.by_sha
    target, leaves = wheels.target, wheels.leaves
    dists = {d.sha256: d for layer in plan.layers for d in layer.dists}
    inputs = {
        "wheels": sorted(dists),
        "base": [layer.digest for layer in base.layers],
        "target": target.key(),
        "leaves_out": {k: sorted(v) for k, v in sorted(leaves.items())},
        "format": LINKCHECK_FORMAT,
    }

    def produce() -> Output:
        if missing := [by_sha[s] for s in dists if s not in blobs and s in by_sha]:
            blobs.update(fetch_wheels(missing, store))
        wheels = [Wheel(d.name, d.version, blobs[s], s) for s, d in sorted(dists.items())]
        torch = next((d.version for d in dists.values() if d.name == "torch"), None)
        layers = [(store.blob_path(layer.digest), layer.media_type) for layer in base.layers]
        with (
            progress.task("link check", len(wheels), unit="dists") as task,
            store.temp_dir("links-") as work,
        ):
            report = check_image(
                wheels,
                layers,
                target,
                work,
                cache=linkcheck.Cache(linkcheck.default_cache()),
                torch=torch,
                leaves=leaves,
                base_digests=[layer.digest for layer in base.layers],
            )
            task.advance(len(wheels))
        return Output(
            outputs={"report": store.add_bytes(canonical_json(report.as_dict()).encode())}
        )

    drv = store.realize("links", inputs, produce).drv
    data = json.loads(store.read_blob(drv.outputs["report"]))
    accept = loaded.spec.image.link_findings
    found = [linkcheck.Finding.from_dict(f) for f in data["findings"]]
    if bad := [f for f in found if f.id not in accept]:
        raise LinkFindings(f"image {plan.spec}", [f.line() for f in bad], [f.id for f in bad])
    return drv.key
