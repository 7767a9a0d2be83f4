"""The whole validation of a spec: load it (types, keys, paths), then check the GPU stack."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from envbuild.errors import Problem, Severity, SpecError
from envbuild.spec.check import check_stack
from envbuild.spec.load import LoadedSpec, load_spec


@dataclass
class Report:
    loaded: LoadedSpec
    warnings: list[Problem]


def validate(path: Path | str, *, root: Path | None = None) -> Report:
    """Load and check a spec. Raises :class:`SpecError` with all errors and warnings when any
    error is found; returns the warnings otherwise."""
    loaded = load_spec(path, root=root)
    problems = check_stack(loaded)
    if any(p.severity is Severity.ERROR for p in problems):
        raise SpecError(problems)
    return Report(loaded, sorted(problems, key=lambda p: (p.file, p.line or 0, p.key)))
