"""The switch journal: what a switch in progress intends and how far it got, so that a switch
cut short by SIGKILL (or a power cut) can be undone by the next envbuild that takes the state lock.

``switch.json`` in the state dir is written atomically before the switch changes anything, and
again after each step: the generation before and the one switched to, the units that must stop
(and so must start again on undo), the unit file the switch replaces (its bytes, base64) and
where the secrets file's old content is kept meanwhile (a 0600 copy beside it, never in the
state dir). When the switch finishes, or is undone in-process, the journal goes away; when a
switch finishes, ``last-switch.json`` keeps what it did (the units that are not envbuild's it
left stopped), for ``envbuild rollback``.

The steps, in order (each recorded once it is done): ``begin``, ``stopped`` (the units that had
to stop are stopped), ``secrets``, ``unit-installed``, ``current`` (the symlink points at the
new generation), ``started`` (the new unit was started), ``healthy`` (it answers; the switch
holds and only bookkeeping is left). Recovery undoes a journal whose step is before ``healthy``
and finishes one at ``healthy``.

For tests, :data:`PAUSE_ENV` = a step's name makes a switch stop and sleep right after it records
that step, so a test can kill it there deterministically.
"""

from __future__ import annotations

import base64
import logging
import os
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from envbuild.apply.generations import Generation
from envbuild.apply.paths import Paths
from envbuild.errors import ManifestError
from envbuild.fsio import canonical_json, write_atomic

log = logging.getLogger(__name__)

JOURNAL_FORMAT = 1
STEPS = ("begin", "stopped", "secrets", "unit-installed", "current", "started", "healthy")
Step = Literal["begin", "stopped", "secrets", "unit-installed", "current", "started", "healthy"]

#: Tests only: the name of a step after which a switch pauses (sleeps until it is killed).
PAUSE_ENV = "ENVBUILD_TEST_PAUSE_AFTER"


class GenRef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    number: int
    name: str

    @classmethod
    def of(cls, gen: Generation | None) -> GenRef | None:
        return cls(number=gen.number, name=gen.name) if gen is not None else None


class Journal(BaseModel):
    """``switch.json``: a switch in progress."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: int = JOURNAL_FORMAT
    operation: str  # apply or rollback
    pid: int
    step: Step = "begin"
    previous: GenRef | None
    target: GenRef
    previous_unit: str | None
    unit: str | None  # the target's unit
    #: The file at the target unit's path before the switch (base64), None when there was none.
    unit_file_before: str | None = None
    #: The secrets file the switch writes, and the 0600 copy of what it held (None: no file).
    env_file: str | None = None
    env_backup: str | None = None
    #: Units running before the switch that it stops (started again on undo), in stop order.
    stop: list[str]
    #: Of those, the ones that are not envbuild's (another service holding GPU memory).
    others: list[str]
    #: The units stopped so far.
    stopped: list[str] = []

    def reached(self, step: Step) -> bool:
        return STEPS.index(self.step) >= STEPS.index(step)

    def unit_bytes_before(self) -> bytes | None:
        before = self.unit_file_before
        return base64.b64decode(before) if before is not None else None


class LastSwitch(BaseModel):
    """``last-switch.json``: the last switch that finished."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: int = JOURNAL_FORMAT
    operation: str
    previous: GenRef | None
    target: GenRef
    stopped: list[str]
    #: Units that are not envbuild's, stopped to free the GPUs and left stopped.
    others: list[str]


def encode(data: bytes | None) -> str | None:
    return base64.b64encode(data).decode() if data is not None else None


def read(paths: Paths) -> Journal | None:
    """The journal of an unfinished switch, or None."""
    try:
        data = paths.journal.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return Journal.model_validate_json(data)
    except (ValidationError, ValueError) as exc:
        raise ManifestError(
            f"{paths.journal}: not a switch journal envbuild can read ({exc})",
            hint="a newer envbuild wrote it, or it was edited; check `current` and the units, "
            "then remove the file",
        ) from exc


def write(paths: Paths, journal: Journal) -> Journal:
    """Record ``journal`` (atomically, fsynced); pause here if a test asked to."""
    write_atomic(paths.journal, canonical_json(journal.model_dump(mode="json")))
    log.debug("journal: %s at step %s", journal.operation, journal.step)
    _pause_if_asked(journal.step)
    return journal


def advance(paths: Paths, journal: Journal, step: Step, **changes: object) -> Journal:
    return write(paths, journal.model_copy(update={"step": step, **changes}))


def clear(paths: Paths, journal: Journal) -> None:
    """The switch is over (finished or undone): forget it, and the secrets copy it kept."""
    paths.journal.unlink(missing_ok=True)
    if journal.env_backup:
        # After the journal: a backup without a journal is only clutter, the reverse would lose
        # what an undo needs.
        Path(journal.env_backup).unlink(missing_ok=True)


def read_last(paths: Paths) -> LastSwitch | None:
    try:
        return LastSwitch.model_validate_json(paths.last_switch.read_bytes())
    except FileNotFoundError:
        return None
    except (ValidationError, ValueError) as exc:
        log.warning("ignoring %s: %s", paths.last_switch, exc)
        return None


def write_last(paths: Paths, last: LastSwitch) -> None:
    write_atomic(paths.last_switch, canonical_json(last.model_dump(mode="json")))


def _pause_if_asked(step: str) -> None:
    if os.environ.get(PAUSE_ENV) != step:
        return
    log.warning("pausing after step %s (%s is set): kill me", step, PAUSE_ENV)
    while True:
        time.sleep(3600)
