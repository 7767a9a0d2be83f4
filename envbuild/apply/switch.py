"""Switching the machine to a generation, as one step that is undone if any part fails.

In order: stop the units that must stop (the old experiment, whatever holds the GPUs), write the
secrets file (0600), install the generation's unit, point ``current`` at the generation, start
the unit and wait for its health endpoint. If anything fails — a crash, a timeout, Ctrl-C — the
steps done are undone in reverse: the new unit stops, ``current`` and the unit files go back,
and the units that were stopped are started again. Only after the new unit is healthy does the
old unit file go away.

Every step is recorded in the switch journal (:mod:`envbuild.apply.journal`) before the next
begins, so a switch killed outright (SIGKILL, a power cut) is undone the same way by
:func:`recover`, which apply, rollback and generations call first, with the state lock held.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbuild.apply import generations as gens
from envbuild.apply import journal as jn
from envbuild.apply.health import health_url, wait_healthy
from envbuild.apply.paths import Paths
from envbuild.apply.services import ServiceManager
from envbuild.errors import EnvbuildError, ServiceFailed
from envbuild.fsio import write_atomic
from envbuild.spec.model import Spec

log = logging.getLogger(__name__)


@dataclass
class SwitchResult:
    previous: int | None
    current: int
    unit: str | None
    unit_file: str | None
    started: bool
    health_url: str | None = None
    healthy_after_s: float | None = None
    stopped: list[str] = field(default_factory=list)
    #: Of the units stopped, those that are not envbuild's: they held GPU memory and stay stopped.
    others_stopped: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "previous": self.previous,
            "current": self.current,
            "unit": self.unit,
            "unit_file": self.unit_file,
            "started": self.started,
            "health_url": self.health_url,
            "healthy_after_s": (
                round(self.healthy_after_s, 1) if self.healthy_after_s is not None else None
            ),
            "stopped": self.stopped,
            "others_stopped": self.others_stopped,
        }


@dataclass(frozen=True)
class Recovery:
    """What :func:`recover` did about a switch that was cut short."""

    operation: str
    pid: int
    step: str
    previous: int | None
    target: int
    #: True: the switch had got its unit healthy, and recovery finished it; False: undone.
    finished: bool
    actions: list[str]

    @property
    def ok(self) -> bool:
        return not any(a.startswith("FAILED") for a in self.actions)

    def summary(self) -> str:
        if self.finished:
            return (
                f"finished the interrupted {self.operation} (pid {self.pid}) to generation "
                f"{self.target}: its unit had become healthy"
            )
        now = f"generation {self.previous}" if self.previous is not None else "no generation"
        return (
            f"undid the unfinished {self.operation} (pid {self.pid}, cut short after step "
            f"{self.step!r}) to generation {self.target}: {now} is current again"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "operation": self.operation,
            "pid": self.pid,
            "step": self.step,
            "previous": self.previous,
            "target": self.target,
            "finished": self.finished,
            "actions": self.actions,
            "ok": self.ok,
        }


def generation_spec(gen: gens.Generation) -> Spec:
    return Spec.model_validate_json((gen.path / "spec.json").read_bytes())


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def switch(
    paths: Paths,
    services: ServiceManager,
    target: gens.Generation,
    *,
    stop_units: list[str],
    env_text: str | None,
    health_timeout: float,
    operation: str = "apply",
) -> SwitchResult:
    """Make ``target`` current and its unit the running one. ``env_text`` is the secrets file's
    content (None keeps the file that is there). Call with the state lock held."""
    prev = gens.current(paths)
    prev_unit = prev.meta.unit if prev else None
    new_unit = target.meta.unit
    spec = generation_spec(target)
    own = {g.meta.unit for g in gens.list_generations(paths) if g.meta.unit}
    stop = [u for u in sorted(set(stop_units)) if services.available and services.is_running(u)]
    result = SwitchResult(
        previous=prev.number if prev else None,
        current=target.number,
        unit=new_unit,
        unit_file=str(paths.unit_file(new_unit)) if new_unit else None,
        started=False,
        others_stopped=[u for u in stop if u not in own],
    )
    env_file, env_backup = None, None
    if new_unit and (env_text is not None or not paths.env_file(spec.name).exists()):
        env_file = paths.env_file(spec.name)
        if (old := _read(env_file)) is not None:
            backup = env_file.with_name(f".{env_file.name}.before-switch")
            write_atomic(backup, old, 0o600)
            env_backup = str(backup)
    journal = jn.write(
        paths,
        jn.Journal(
            operation=operation,
            pid=os.getpid(),
            previous=jn.GenRef.of(prev),
            target=jn.GenRef(number=target.number, name=target.name),
            previous_unit=prev_unit,
            unit=new_unit,
            unit_file_before=jn.encode(_read(paths.unit_file(new_unit))) if new_unit else None,
            env_file=str(env_file) if env_file else None,
            env_backup=env_backup,
            stop=stop,
            others=result.others_stopped,
        ),
    )
    try:
        for unit in stop:
            services.stop(unit)
            result.stopped.append(unit)
        journal = jn.advance(paths, journal, "stopped", stopped=list(result.stopped))
        if env_file is not None:
            paths.secrets.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_atomic(env_file, env_text or "", 0o600)
        journal = jn.advance(paths, journal, "secrets")
        if new_unit:
            unit_source = target.unit_file()
            assert unit_source is not None
            write_atomic(paths.unit_file(new_unit), unit_source.read_bytes(), 0o644)
            services.reload()
        journal = jn.advance(paths, journal, "unit-installed")
        gens.set_current(paths, target)
        journal = jn.advance(paths, journal, "current")
        if new_unit and services.available and spec.serve is not None:
            services.start(new_unit)
            result.started = True
            journal = jn.advance(paths, journal, "started")
            result.health_url = health_url(spec.serve.host, spec.serve.port)
            result.healthy_after_s = wait_healthy(
                result.health_url, services, new_unit, timeout=health_timeout
            )
        journal = jn.advance(paths, journal, "healthy")
    except BaseException as exc:
        restored = undo(paths, services, journal, health_timeout=health_timeout)
        jn.clear(paths, journal)
        if isinstance(exc, ServiceFailed):
            exc.restored = restored
            exc.hint = exc.hint or "the machine is back as it was; fix the cause and apply again"
        elif isinstance(exc, EnvbuildError):
            log.error("switch failed; restored: %s", "; ".join(restored) or "nothing to restore")
        raise
    _finish(paths, services, journal)
    return result


def undo(
    paths: Paths, services: ServiceManager, j: jn.Journal, *, health_timeout: float | None
) -> list[str]:
    """Put back what the switch ``j`` changed, whatever step it reached; every action checks the
    state first, so undoing twice (a recovery cut short) is harmless. With ``health_timeout``,
    the previous experiment's unit is waited for until it serves again. Returns what was done
    (``FAILED: …`` for what could not be; the rest is still tried)."""
    done: list[str] = []

    def attempt(what: str, fn: Callable[[], object]) -> None:
        try:
            fn()
            done.append(what)
        except BaseException as exc:  # keep undoing the rest, whatever happens
            log.error("could not undo (%s): %s", what, exc)
            done.append(f"FAILED: {what} ({exc})")

    unit = j.unit
    if (
        unit
        and services.available
        and j.reached("unit-installed")
        and _running(services, unit) is not False
    ):
        attempt(f"stopped {unit}", lambda: services.stop(unit))
    if unit:
        unit_file = paths.unit_file(unit)
        before = j.unit_bytes_before()
        if _read(unit_file) != before:

            def put_back_unit() -> None:
                if before is None:
                    unit_file.unlink(missing_ok=True)
                else:
                    write_atomic(unit_file, before, 0o644)
                services.reload()

            attempt(f"put back {unit_file}", put_back_unit)
    if j.env_file:
        env_file = Path(j.env_file)
        backup = j.env_backup
        if backup is not None and os.path.exists(backup):
            attempt(f"put back {env_file}", lambda: os.replace(backup, env_file))
        elif backup is None and env_file.exists():
            attempt(f"put back {env_file}", env_file.unlink)
    prev = None
    if j.previous is not None and (prev := _generation(paths, j.previous.name)) is None:
        gone = j.previous
        done.append(f"FAILED: current -> generation {gone.number} ({gone.name} is gone)")
    elif _current_name(paths) != (j.previous.name if j.previous else None):
        what = f"current -> generation {j.previous.number}" if j.previous else "current removed"
        attempt(what, lambda: gens.set_current(paths, prev))
    prev_url = None
    if prev is not None and j.previous_unit and health_timeout is not None:
        serve = generation_spec(prev).serve
        prev_url = health_url(serve.host, serve.port) if serve else None
    for stopped in j.stop:
        if not services.available:
            done.append(f"FAILED: start {stopped} again ({getattr(services, 'reason', '')})")
        elif _running(services, stopped) is not True:
            url = prev_url if stopped == j.previous_unit else None
            attempt(
                f"started {stopped} again", _starter(services, stopped, url, health_timeout or 0)
            )
    return done


def _starter(
    services: ServiceManager, unit: str, url: str | None, timeout: float
) -> Callable[[], None]:
    """Start ``unit`` again; for the previous experiment, wait until it serves again."""

    def start() -> None:
        services.start(unit)
        if url is not None:
            wait_healthy(url, services, unit, timeout=timeout)

    return start


def _running(services: ServiceManager, unit: str) -> bool | None:
    """Whether ``unit`` runs; None when the service manager cannot say (then undo acts anyway:
    stopping a stopped unit or starting a running one changes nothing)."""
    try:
        return services.is_running(unit)
    except EnvbuildError as exc:
        log.error("cannot tell whether %s runs: %s", unit, exc.message)
        return None


def _generation(paths: Paths, name: str) -> gens.Generation | None:
    return next((g for g in gens.list_generations(paths) if g.name == name), None)


def _current_name(paths: Paths) -> str | None:
    try:
        return Path(os.readlink(paths.current)).name
    except FileNotFoundError:
        return None


def _finish(paths: Paths, services: ServiceManager, j: jn.Journal) -> list[str]:
    """The switch held: enable the new unit, retire the old one's file, record what it did."""
    done = []
    if j.unit:
        services.enable(j.unit)
        done.append(f"enabled {j.unit}")
    prev_unit = j.previous_unit
    if prev_unit and prev_unit != j.unit:
        services.disable(prev_unit)
        paths.unit_file(prev_unit).unlink(missing_ok=True)
        services.reload()
        log.info("retired %s", prev_unit)
        done.append(f"retired {prev_unit}")
    if j.others:
        log.warning("left stopped (not envbuild's; they held GPU memory): %s", ", ".join(j.others))
    jn.write_last(
        paths,
        jn.LastSwitch(
            operation=j.operation,
            previous=j.previous,
            target=j.target,
            stopped=j.stop,
            others=j.others,
        ),
    )
    jn.clear(paths, j)
    return done


def recover(paths: Paths, services: ServiceManager) -> Recovery | None:
    """Deal with a switch that was cut short, if the journal shows one: undo it (or finish it,
    when its unit had become healthy). Call with the state lock held, before anything else.
    Raises :class:`ServiceFailed` when part of the undo failed (the rest was done)."""
    j = jn.read(paths)
    if j is None:
        return None
    log.warning(
        "found an unfinished %s (pid %d) to generation %d, cut short after step %r",
        j.operation,
        j.pid,
        j.target.number,
        j.step,
    )
    if j.reached("healthy"):
        actions = _finish(paths, services, j)
    else:
        actions = undo(paths, services, j, health_timeout=None)
        jn.clear(paths, j)
    rec = Recovery(
        operation=j.operation,
        pid=j.pid,
        step=j.step,
        previous=j.previous.number if j.previous else None,
        target=j.target.number,
        finished=j.reached("healthy"),
        actions=actions,
    )
    log.info("%s (%s)", rec.summary(), "; ".join(actions) or "nothing else to do")
    if not rec.ok:
        raise ServiceFailed(
            rec.summary() + ", but not all of it could be put back",
            restored=actions,
            hint="fix what FAILED by hand (`envbuild generations` shows what is current)",
        )
    return rec
