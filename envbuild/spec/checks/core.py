"""The checks of a spec's GPU stack, one module per area. Each check takes the loaded spec and
its target GPUs and yields located problems; :func:`envbuild.spec.check.check_stack` runs all."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from packaging.version import Version

from envbuild.errors import Problem, Severity
from envbuild.spec import knowledge as kb
from envbuild.spec.load import LoadedSpec

WARNING = Severity.WARNING


@dataclass(frozen=True)
class SpecGpu:
    """A GPU entry of ``[host]`` with the knowledge base's values filled in."""

    index: int
    count: int
    capability: str | None
    memory_gib: float | None


Check = Callable[[LoadedSpec, list[SpecGpu]], Iterator[Problem]]


def spec_gpus(loaded: LoadedSpec) -> list[SpecGpu]:
    host = loaded.spec.host
    out = []
    for i, g in enumerate(host.gpus if host else []):
        fact = kb.gpu(g.model)
        out.append(
            SpecGpu(
                i,
                g.count,
                g.compute_capability or (fact.compute_capability if fact else None),
                g.memory_gib or (fact.memory_gib if fact else None),
            )
        )
    return out


def capabilities(gpus: list[SpecGpu]) -> list[str]:
    """The distinct compute capabilities of the target GPUs, lowest first."""
    return sorted({g.capability for g in gpus if g.capability}, key=Version)
