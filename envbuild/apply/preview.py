"""``envbuild render unit``: the vLLM unit apply would install for a spec on this machine.

The generation's number is the next one in the state dir; its folder's name holds the content
hash, which is known without building when the lock needs no store wheel (or the store already
holds them). Secrets stay out: the EnvironmentFile is described by its keys only.
"""

from __future__ import annotations

from envbuild.apply import generations as gens
from envbuild.apply import unit as units
from envbuild.apply.builder import generation_hash
from envbuild.apply.inputs import ApplyInput
from envbuild.apply.paths import Paths
from envbuild.apply.wheels import WheelProvider, wanted
from envbuild.errors import UserError


def unit_preview(inp: ApplyInput, paths: Paths, wheels: WheelProvider) -> units.Preview:
    spec = inp.spec
    if spec.serve is None:
        raise UserError(
            f"spec {spec.name} has no [serve]: apply installs no unit for it",
            hint="add [serve] (and [model]) to serve the model with vLLM",
        )
    number = gens.next_number(paths)
    stored = wheels.stored(inp) if wanted(inp) else {}
    if stored is not None:
        folder = gens.dir_name(number, generation_hash(paths, inp, stored))
    else:
        folder = f"{number}-unbuilt"
    return units.preview(
        spec,
        inp.spec_hash,
        generation=number,
        generation_path=paths.generations / folder,
        hf_home=paths.hf_home,
        env_file=paths.env_file(spec.name),
        exact_path=stored is not None,
    )
