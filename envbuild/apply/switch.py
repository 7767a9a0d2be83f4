"""Switching the machine to a generation, as one step that is undone if any part fails.

In order: stop the units that must stop (the old experiment, whatever holds the GPUs), write the
secrets file (0600), install the generation's unit, point ``current`` at the generation, start
the unit and wait for its health endpoint. If anything fails — a crash, a timeout, Ctrl-C — the
steps done are undone in reverse: the new unit stops, ``current`` and the unit files go back,
and the units that were stopped are started again. Only after the new unit is healthy does the
old unit file go away.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbuild.apply import generations as gens
from envbuild.apply.health import health_url, wait_healthy
from envbuild.apply.paths import Paths
from envbuild.apply.services import ServiceManager
from envbuild.errors import EnvbuildError, ServiceFailed
from envbuild.fsio import write_atomic
from envbuild.spec.model import Spec

log = logging.getLogger("envbuild.apply.switch")


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
        }


def generation_spec(gen: gens.Generation) -> Spec:
    return Spec.model_validate_json((gen.path / "spec.json").read_bytes())


class _Undo:
    def __init__(self) -> None:
        self.steps: list[tuple[str, Callable[[], None]]] = []

    def push(self, what: str, fn: Callable[[], None]) -> None:
        self.steps.append((what, fn))

    def run(self) -> list[str]:
        done = []
        for what, fn in reversed(self.steps):
            try:
                fn()
                done.append(what)
            except BaseException as exc:  # keep undoing the rest, whatever happens
                log.error("could not undo (%s): %s", what, exc)
                done.append(f"FAILED: {what} ({exc})")
        self.steps.clear()
        return done


def _restore_file(path: Path, old: bytes | None, mode: int) -> Callable[[], None]:
    def restore() -> None:
        if old is None:
            path.unlink(missing_ok=True)
        else:
            write_atomic(path, old, mode)

    return restore


def _starter(
    services: ServiceManager, unit: str, url: str | None, timeout: float
) -> Callable[[], None]:
    """Start ``unit`` again; for the previous experiment, wait until it serves again."""

    def start() -> None:
        services.start(unit)
        if url is not None:
            wait_healthy(url, services, unit, timeout=timeout)

    return start


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
) -> SwitchResult:
    """Make ``target`` current and its unit the running one. ``env_text`` is the secrets file's
    content (None keeps the file that is there)."""
    prev = gens.current(paths)
    prev_unit = prev.meta.unit if prev else None
    new_unit = target.meta.unit
    spec = generation_spec(target)
    result = SwitchResult(
        previous=prev.number if prev else None,
        current=target.number,
        unit=new_unit,
        unit_file=str(paths.unit_file(new_unit)) if new_unit else None,
        started=False,
    )
    undo = _Undo()
    prev_url = None
    if prev is not None and prev_unit:
        prev_serve = generation_spec(prev).serve
        prev_url = health_url(prev_serve.host, prev_serve.port) if prev_serve else None
    try:
        if services.available:
            for unit in sorted(set(stop_units)):
                if services.is_running(unit):
                    services.stop(unit)
                    result.stopped.append(unit)
                    url = prev_url if unit == prev_unit else None
                    undo.push(
                        f"started {unit} again", _starter(services, unit, url, health_timeout)
                    )
        if new_unit:
            env_file = paths.env_file(spec.name)
            if env_text is not None:
                paths.secrets.mkdir(mode=0o700, parents=True, exist_ok=True)
                undo.push(f"put back {env_file}", _restore_file(env_file, _read(env_file), 0o600))
                write_atomic(env_file, env_text, 0o600)
            elif not env_file.exists():
                write_atomic(env_file, "", 0o600)
            unit_file = paths.unit_file(new_unit)
            old_unit = _read(unit_file)

            def put_back_unit() -> None:
                _restore_file(unit_file, old_unit, 0o644)()
                services.reload()

            undo.push(f"put back {unit_file}", put_back_unit)
            unit_source = target.unit_file()
            assert unit_source is not None
            write_atomic(unit_file, unit_source.read_bytes(), 0o644)
            services.reload()
        undo.push(
            f"current -> generation {prev.number}" if prev else "current removed",
            lambda: gens.set_current(paths, prev),
        )
        gens.set_current(paths, target)
        if new_unit and services.available and spec.serve is not None:
            undo.push(f"stopped {new_unit}", lambda: services.stop(new_unit))
            services.start(new_unit)
            result.started = True
            result.health_url = health_url(spec.serve.host, spec.serve.port)
            result.healthy_after_s = wait_healthy(
                result.health_url, services, new_unit, timeout=health_timeout
            )
    except BaseException as exc:
        restored = undo.run()
        if isinstance(exc, ServiceFailed):
            exc.restored = restored
            exc.hint = exc.hint or "the machine is back as it was; fix the cause and apply again"
        elif isinstance(exc, EnvbuildError):
            log.error("switch failed; restored: %s", "; ".join(restored) or "nothing to restore")
        raise
    _commit(paths, services, prev_unit, new_unit)
    return result


def _commit(paths: Paths, services: ServiceManager, prev_unit: str | None, new: str | None) -> None:
    """The switch held: enable the new unit, retire the old one's file."""
    if new:
        services.enable(new)
    if prev_unit and prev_unit != new:
        services.disable(prev_unit)
        paths.unit_file(prev_unit).unlink(missing_ok=True)
        services.reload()
        log.info("retired %s", prev_unit)
