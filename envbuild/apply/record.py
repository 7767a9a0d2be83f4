"""The snapshot of the result, written beside the generation it describes, through the snapshot
stage: ``generations/<n>-<hash>.snapshot.json`` when the generation is made (kept as it is), and
``<n>-<hash>.snapshot.<k>.json`` (k = 2, 3 …) for every later apply that finds it."""

from __future__ import annotations

import logging

from envbuild.apply.generations import Generation
from envbuild.apply.host import HostAccess
from envbuild.apply.inputs import ApplyInput
from envbuild.apply.probe import SystemProbe
from envbuild.apply.services import Systemctl
from envbuild.fsio import canonical_json, write_atomic
from envbuild.snapshot.core import Options, take_snapshot
from envbuild.snapshot.model.core import SpecRef

log = logging.getLogger(__name__)

#: The units a snapshot records: envbuild's own and any other vLLM unit.
UNITS = "envbuild-*"


def write_snapshot(host: HostAccess, gen: Generation, inp: ApplyInput) -> str:
    probe = host.probe
    snap = take_snapshot(
        Options(
            pythons=[str(gen.venv / "bin" / "python")],
            # Every file was hashed when the generation was built or reused; now sizes suffice.
            integrity="quick",
            hf_cache=str(host.paths.hf_hub_cache),
            services=UNITS,
            docker=False,
            systemd=isinstance(host.services, Systemctl),
            nvml=probe.nvml if isinstance(probe, SystemProbe) else None,
        )
    )
    snap = snap.model_copy(
        update={
            "spec": SpecRef(
                name=inp.name,
                path=inp.spec_path,
                spec_hash=inp.spec_hash,
                lock_path=inp.lock_path,
                lock_sha256=inp.lock_sha256,
            )
        }
    )
    path = gen.next_snapshot_file()
    write_atomic(path, canonical_json(snap.model_dump(mode="json")))
    log.info("wrote %s", path)
    return str(path)
