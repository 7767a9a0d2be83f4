"""Whether a spec's GPU stack fits together, checked against the knowledge base.

The checks live in :mod:`envbuild.spec.checks` (one module per area); each reads the typed spec,
asks :mod:`envbuild.spec.knowledge` for facts, and yields located problems (file, line, dotted
key, what is wrong, how to fix it). :func:`check_stack` runs them all and returns every error
and warning at once; it never stops at the first.
"""

from __future__ import annotations

from envbuild.errors import Problem
from envbuild.spec.checks import builds, consistency, serve, stack
from envbuild.spec.checks.core import Check, spec_gpus
from envbuild.spec.load import LoadedSpec

#: Every check, in the order their problems are found (the report is sorted by place anyway).
CHECKS: tuple[Check, ...] = (
    stack.host_gpus,
    stack.driver_vs_cuda,
    stack.torch_variant,
    stack.vllm_pins,
    builds.source_builds,
    serve.parallelism,
    serve.kv_cache,
    serve.model_size,
    serve.extra_args,
    consistency.pins,
    consistency.secrets,
    consistency.secret_flags,
    consistency.platform,
)


def check_stack(loaded: LoadedSpec) -> list[Problem]:
    """Every error and warning about how the spec's parts fit together."""
    gpus = spec_gpus(loaded)
    problems: list[Problem] = []
    for check in CHECKS:
        problems.extend(check(loaded, gpus))
    return problems
