"""Looking after generations: list them, check them, roll back, remove old ones."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from envbuild.apply import generations as gens
from envbuild.apply import journal as jn
from envbuild.apply import shared
from envbuild.apply import unit as units
from envbuild.apply.host import HostAccess
from envbuild.apply.integrity import GenerationCheck, check_generation, installed_unit_problems
from envbuild.apply.paths import Paths
from envbuild.apply.services import ServiceManager
from envbuild.apply.stateguard import state_guard
from envbuild.apply.switch import Recovery, SwitchResult, generation_spec, recover, switch
from envbuild.apply.wheels import WheelProvider
from envbuild.errors import (
    Busy,
    EnvbuildError,
    EnvironmentFailure,
    IntegrityError,
    OutputError,
    UserError,
)
from envbuild.store.core import Store
from envbuild.store.gc import collect_trees

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationInfo:
    number: int
    name: str
    path: str
    spec_name: str
    spec_hash: str
    created: str
    origin: str
    unit: str | None
    current: bool
    check: GenerationCheck | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "number": self.number,
            "name": self.name,
            "path": self.path,
            "spec": self.spec_name,
            "spec_hash": self.spec_hash,
            "created": self.created,
            "origin": self.origin,
            "unit": self.unit,
            "current": self.current,
        }
        if self.check is not None:
            out["check"] = self.check.as_dict()
        return out


def list_infos(
    paths: Paths, *, verify: bool = False, store: Store | None = None
) -> list[GenerationInfo]:
    """Every generation, and with ``verify`` the check of each (each shared install tree is
    hashed once, and a change in one is named with every generation that links it)."""
    cur = gens.current(paths)
    out = []
    every = gens.list_generations(paths)
    memo: dict[str, list[str] | None] = {}
    links = shared.linked_by(every)
    for gen in every:
        check = None
        if verify:
            check = check_generation(gen, store=store, memo=memo, links=links)
            current = cur is not None and cur.number == gen.number
            if current and (extra := installed_unit_problems(paths, gen)):  # what systemd runs
                check = GenerationCheck(gen.number, gen.name, [*check.problems, *extra])
        out.append(
            GenerationInfo(
                number=gen.number,
                name=gen.name,
                path=str(gen.path),
                spec_name=gen.meta.spec_name,
                spec_hash=gen.meta.spec_hash,
                created=gen.meta.created.strftime("%Y-%m-%dT%H:%M:%SZ"),
                origin=gen.meta.origin,
                unit=gen.meta.unit,
                current=cur is not None and cur.number == gen.number,
                check=check,
            )
        )
    return out


def recover_pending(
    host: HostAccess, *, wait: float = 0.0, busy_ok: bool = False
) -> Recovery | None:
    """Undo (or finish) a switch that was cut short, if the journal shows one: for commands that
    otherwise only read (``generations``) and for ``apply --recover``. Takes the state lock only
    when there is a journal. ``busy_ok``: when the lock cannot be had — another envbuild holds
    it (so its switch is running, not cut short), or this user may not write the state dir —
    say so and do nothing."""
    if not host.paths.journal.exists():
        return None
    try:
        with state_guard(host.paths, wait=wait, what="recover"):
            return recover(host.paths, host.services)
    except Busy as exc:
        if not busy_ok:
            raise
        log.warning("a switch is in progress: %s", exc.message)
    except OutputError as exc:
        if not busy_ok:
            raise
        log.warning("a switch was cut short, and is not undone: %s", exc.message)
    return None


@dataclass
class RollbackOutcome:
    #: A switch that was cut short and undone first (then nothing more may be needed).
    recovered: Recovery | None
    #: The rollback's own switch; None when the recovery already went back.
    switch: SwitchResult | None
    #: Units that are not envbuild's which the rolled-back apply had stopped: started again
    #: (``--yes``), or left stopped.
    others_started: list[str] = field(default_factory=list)
    others_stopped: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "recovered": self.recovered.as_dict() if self.recovered else None,
            "switch": self.switch.as_dict() if self.switch else None,
            "others_started": self.others_started,
            "others_stopped": self.others_stopped,
        }


def rollback(
    host: HostAccess,
    *,
    to: int | None = None,
    agreed: bool = False,
    wait: float = 0.0,
    health_timeout: float = 1800.0,
) -> RollbackOutcome:
    """Switch back to generation ``to`` (default: the newest one older than current). Units that
    are not envbuild's and that the current generation's apply stopped (they held GPU memory)
    are started again when ``agreed``, else named as still stopped.

    A switch cut short is undone first; if it was an apply and no ``to`` is given, that undo is
    the rollback (the generation before it is current again) and nothing more is switched."""
    paths = host.paths
    with state_guard(paths, wait=wait, what="rollback"):
        recovered = recover(paths, host.services)
        if (
            recovered is not None
            and not recovered.finished
            and recovered.operation == "apply"
            and (to is None or to == recovered.previous)
        ):
            return RollbackOutcome(recovered, None)
        cur = gens.current(paths)
        every = gens.list_generations(paths)
        if to is None:
            if cur is None:
                raise UserError("nothing to roll back: no generation is current yet")
            older = [g for g in every if g.number < cur.number]
            if not older:
                raise UserError(
                    f"generation {cur.number} is the oldest one here: nothing to roll back to"
                )
            target = older[-1]
        else:
            target = gens.find(paths, to)
        if cur is not None and target.number == cur.number:
            raise UserError(f"generation {target.number} is already current")
        check = check_generation(target)
        if not check.ok:
            raise IntegrityError(
                f"generation {target.number} was modified after it was built: "
                + "; ".join(check.problems[:3]),
                hint="apply its spec again to build a fresh generation",
            )
        spec = generation_spec(target)
        stop = [cur.meta.unit] if cur is not None and cur.meta.unit else []
        env_text = None
        if target.meta.unit and all(n in os.environ for n in units.secret_names(spec)):
            env_text = units.render_env_file(spec, os.environ)
        elif target.meta.unit and not paths.env_file(spec.name).exists():
            units.render_env_file(spec, os.environ)  # raises, naming what is missing
        log.info(
            "rolling back from generation %s to %d",
            cur.number if cur else "none",
            target.number,
        )
        last = jn.read_last(paths)
        others = last.others if last and cur and last.target.name == cur.name else []
        result = switch(
            paths,
            host.services,
            target,
            stop_units=stop,
            env_text=env_text,
            health_timeout=health_timeout,
            operation="rollback",
        )
        outcome = RollbackOutcome(recovered, result)
        if agreed:
            outcome.others_started = _start_again(host.services, others, target.number)
        else:
            outcome.others_stopped = list(others)
        return outcome


def _start_again(services: ServiceManager, others: list[str], number: int) -> list[str]:
    started = []
    for unit in others:
        try:
            if not services.is_running(unit):
                services.start(unit)
            started.append(unit)
        except EnvbuildError as exc:
            raise EnvironmentFailure(
                f"rolled back to generation {number}, but {unit} did not start again: "
                f"{exc.message}",
                hint=f"start it yourself (`systemctl start {unit}`)",
            ) from exc
    return started


@dataclass
class GcResult:
    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    freed_bytes: int = 0
    #: install trees no generation links any more, removed from the store
    removed_trees: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "removed": self.removed,
            "kept": self.kept,
            "freed_bytes": self.freed_bytes,
            "removed_trees": self.removed_trees,
        }


def gc(
    paths: Paths,
    *,
    keep: int = 3,
    dry_run: bool = False,
    wait: float = 0.0,
    wheels: WheelProvider | None = None,
    store: Store | None = None,
) -> GcResult:
    """Remove all but the ``keep`` newest generations; the current one always stays. ``wheels``
    drops the store root of each generation removed (its wheels become collectable); then the
    install trees of ``store`` that no generation links any more go too."""
    if keep < 0:
        raise UserError("--keep must be 0 or more")
    with state_guard(paths, wait=wait, what="gc"):
        if not dry_run:
            gens.remove_leftovers(paths)
        if paths.journal.exists() and not dry_run:
            # gc never removes current; a cut-short switch means two generations are in use.
            raise EnvironmentFailure(
                f"a switch was cut short ({paths.journal})",
                hint="run `envbuild apply --recover` (or `envbuild generations`) first",
            )
        cur = gens.current(paths)
        every = gens.list_generations(paths)
        newest = {g.number for g in every[len(every) - keep :]} if keep else set()
        result = GcResult()
        for gen in every:
            if gen.number in newest or (cur is not None and gen.number == cur.number):
                result.kept.append(gen.name)
                continue
            result.freed_bytes += _du(gen.path)
            result.removed.append(gen.name)
            if not dry_run:
                snapshots = gen.snapshot_files()
                gens.remove_tree(gen.path)
                for snapshot in snapshots:
                    snapshot.unlink(missing_ok=True)
                if wheels is not None:
                    wheels.release(gen)
                log.info("removed generation %d (%s)", gen.number, gen.name)
        if store is not None:
            # a dry run removes no generation, so no tree loses its last one
            removed, _linked, freed = ([], [], 0) if dry_run else collect_trees(store)
            result.removed_trees, result.freed_bytes = removed, result.freed_bytes + freed
        return result


def _du(path: os.PathLike[str] | str) -> int:
    total = 0
    for top, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(top, name))
            except OSError:
                continue
            if st.st_nlink == 1:  # a file an install tree shares is not freed with the folder
                total += st.st_size
    return total
