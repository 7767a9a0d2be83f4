"""Looking after generations: list them, check them, roll back, remove old ones."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from envbuild.apply import generations as gens
from envbuild.apply import unit as units
from envbuild.apply.host import Host
from envbuild.apply.integrity import GenerationCheck, check_generation
from envbuild.apply.paths import Paths
from envbuild.apply.statelock import state_lock
from envbuild.apply.switch import SwitchResult, generation_spec, switch
from envbuild.errors import IntegrityError, UserError

log = logging.getLogger("envbuild.apply.manage")


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


def list_infos(paths: Paths, *, verify: bool = False) -> list[GenerationInfo]:
    cur = gens.current(paths)
    out = []
    for gen in gens.list_generations(paths):
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
                check=check_generation(gen) if verify else None,
            )
        )
    return out


def rollback(
    host: Host,
    *,
    to: int | None = None,
    wait: float = 0.0,
    health_timeout: float = 1800.0,
) -> SwitchResult:
    """Switch back to generation ``to`` (default: the newest one older than current)."""
    paths = host.paths
    with state_lock(paths, wait=wait, what="rollback"):
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
        return switch(
            paths,
            host.services,
            target,
            stop_units=stop,
            env_text=env_text,
            health_timeout=health_timeout,
        )


@dataclass
class GcResult:
    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    freed_bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"removed": self.removed, "kept": self.kept, "freed_bytes": self.freed_bytes}


def gc(paths: Paths, *, keep: int = 3, dry_run: bool = False, wait: float = 0.0) -> GcResult:
    """Remove all but the ``keep`` newest generations; the current one always stays."""
    if keep < 0:
        raise UserError("--keep must be 0 or more")
    with state_lock(paths, wait=wait, what="gc"):
        if not dry_run:
            gens.remove_leftovers(paths)
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
                gens.remove_tree(gen.path)
                gen.snapshot_file.unlink(missing_ok=True)
                log.info("removed generation %d (%s)", gen.number, gen.name)
        return result


def _du(path: os.PathLike[str] | str) -> int:
    total = 0
    for top, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(top, name)).st_size
            except OSError:
                continue
    return total
