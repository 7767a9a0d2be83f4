"""Check the live machine against a snapshot manifest: take a new snapshot of the same scope
(the same Python environments, service pattern and model cache) and keep only what drifted."""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from envbuild.engine import ContainerEngine
from envbuild.snapshot.core import Options, take_snapshot
from envbuild.snapshot.diff.compare import DiffResult, compare
from envbuild.snapshot.diff.machine import snapshot_facts
from envbuild.snapshot.gpu import gpu_warnings
from envbuild.snapshot.model.core import Snapshot, load_snapshot
from envbuild.snapshot.nvml import Nvml
from envbuild.snapshot.records import Mode

log = logging.getLogger(__name__)

LIVE = "this machine"


@dataclass
class GpuMemory:
    """Who holds a GPU's memory on this machine now (state: shown, never drift)."""

    gpu: int
    name: str
    total_bytes: int
    used_bytes: int
    reserved_bytes: int | None
    processes: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class VerifyResult:
    manifest: str
    diff: DiffResult
    gpu_memory: list[GpuMemory] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def drift(self) -> bool:
        return self.diff.different

    def as_dict(self) -> dict[str, Any]:
        data = self.diff.as_dict()
        data["groups"] = [g for g in data["groups"] if g["counts"]]
        return {
            "manifest": self.manifest,
            "drift": self.drift,
            **data,
            "gpu_memory": [asdict(m) for m in self.gpu_memory],
            "warnings": self.warnings,
        }


def gpu_memory(snap: Snapshot) -> list[GpuMemory]:
    """The GPUs whose memory something holds, with the processes NVML names."""
    return [
        GpuMemory(
            gpu=g.index,
            name=g.name,
            total_bytes=g.memory_total_bytes,
            used_bytes=g.memory_used_bytes,
            reserved_bytes=g.memory_reserved_bytes,
            processes=[p.model_dump(mode="json") for p in g.processes],
        )
        for g in snap.gpu.gpus
        if g.memory_used_bytes or g.processes
    ]


def scope_of(snap: Snapshot, pythons: list[str] | None, integrity: Mode) -> Options:
    """The snapshot options that look at what ``snap`` looked at. Environments that are gone
    are left out (the diff then reports them as removed)."""
    wanted = pythons if pythons else [env.requested for env in snap.pythons]
    present = [p for p in wanted if pythons or os.path.lexists(p)]
    for gone in sorted(set(wanted) - set(present)):
        log.info("%s is gone", gone)
    return Options(
        pythons=present,
        integrity=integrity,
        hf_cache=snap.hf_cache.path if snap.hf_cache is not None else None,
        models=snap.hf_cache is not None,
        services=snap.systemd.pattern if snap.systemd is not None else "vllm*",
        systemd=snap.systemd is not None,
        docker=snap.docker is not None,
    )


def verify(
    manifest: Path,
    *,
    pythons: list[str] | None = None,
    integrity: Mode = "full",
    nvml: Nvml | None = None,
    engine: ContainerEngine | None = None,
) -> VerifyResult:
    """``engine``: the container engine to ask, as for the snapshot (the CLI's
    :func:`~envbuild.cli.engineopts.docker_engine`, ``$DOCKER_HOST``); None: the default socket."""
    recorded = load_snapshot(manifest)
    opts = scope_of(recorded, pythons, integrity)
    opts.nvml = nvml
    opts.engine = engine
    live = take_snapshot(opts)
    a = snapshot_facts(recorded, str(manifest))
    for key in ("refs", "layers"):  # what it was built from is not machine state
        a.groups.pop(key, None)
    return VerifyResult(
        str(manifest),
        compare(a, snapshot_facts(live, LIVE)),
        gpu_memory=gpu_memory(live),
        warnings=gpu_warnings(live.gpu),
    )
