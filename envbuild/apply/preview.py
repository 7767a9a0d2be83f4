"""``envbuild render unit``: the vLLM unit apply would install for a spec on this machine.

What apply would do: a generation with these inputs that still verifies is reused (its number
and folder, found by the check apply runs); otherwise the next number in the state dir. The
folder's name holds the content hash, which is known without building when the lock needs no
store wheel (or the store already holds them). Secrets stay out: the EnvironmentFile is
described by its keys only.
"""

from __future__ import annotations

from envbuild.apply import generations as gens
from envbuild.apply import unit as units
from envbuild.apply.inputs import ApplyInput
from envbuild.apply.paths import Paths
from envbuild.apply.realize import find_reusable, generation_hash
from envbuild.apply.wheels import WheelProvider, wanted
from envbuild.errors import UserError
from envbuild.store.core import Store


def unit_preview(
    inp: ApplyInput, paths: Paths, wheels: WheelProvider, store: Store | None = None
) -> units.Preview:
    """``store``: the one whose install trees generations link (:attr:`HostAccess.store`)."""
    spec = inp.spec
    if spec.serve is None:
        raise UserError(
            f"spec {spec.name} has no [serve]: apply installs no unit for it",
            hint="add [serve] (and [model]) to serve the model with vLLM",
        )
    number = gens.next_number(paths)
    stored = wheels.stored(inp) if wanted(inp) else {}
    reused = False
    if stored is not None:
        chash = generation_hash(paths, inp, stored)
        found = find_reusable(paths, chash, store=store).generation  # as apply decides
        if found is not None:
            number, folder, reused = found.number, found.name, True
        else:
            folder = gens.dir_name(number, chash)
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
        reused=reused,
    )
