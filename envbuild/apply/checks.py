"""Preflight's report: each check (a name, a status, a message, a hint, and whether a failure
means the spec does not fit the machine or the machine is not ready), the report that gathers
them, and the exit code the report maps to. The checks themselves are in
:mod:`envbuild.apply.preflight` and :mod:`envbuild.apply.hostchecks`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from envbuild.errors import ExitCode

GIB = 1 << 30


class Status(StrEnum):
    """How a check came out; only FAIL stops apply."""

    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


class Kind(StrEnum):
    """What a failed check means, which decides the exit code."""

    FIT = "fit"  # the spec does not fit this machine (exit 2)
    ENVIRONMENT = "environment"  # the machine is not ready (exit 3)


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    name: str
    status: Status
    message: str
    hint: str | None = None
    kind: Kind = Kind.ENVIRONMENT

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status.value,
            "message": self.message,
            "hint": self.hint,
            "kind": self.kind.value,
        }


@dataclass
class PreflightReport:
    """Every check preflight ran, in order, and the units apply will stop."""

    checks: list[Check] = field(default_factory=list)
    #: Units apply will stop (the user must agree with --yes).
    stop_units: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status is Status.FAIL]

    @property
    def exit_code(self) -> int:
        """0 when nothing failed; 2 when the spec does not fit the machine (a FIT failure
        outweighs any other); 3 when the machine is not ready."""
        if not self.failures:
            return ExitCode.OK
        if any(c.kind is Kind.FIT for c in self.failures):
            return ExitCode.USER_ERROR
        return ExitCode.ENVIRONMENT

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "exit_code": self.exit_code,
            "checks": [c.as_dict() for c in self.checks],
            "stop_units": self.stop_units,
        }


def gib(n: int) -> str:
    """A size in bytes as the checks write it: ``12.3 GiB``."""
    return f"{n / GIB:.1f} GiB"
