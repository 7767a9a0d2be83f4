"""Whether a spec's GPU stack fits together, checked against the knowledge base."""

from __future__ import annotations

from envbuild.errors import Problem
from envbuild.spec.load import LoadedSpec


def check_stack(loaded: LoadedSpec) -> list[Problem]:
    """Every error and warning about how the spec's parts fit together."""
    return []
