"""``envbuild apply``: preflight, realize the generation, fetch the model, switch, record.

One function, :func:`apply`, runs the stages in order under the state lock and returns an
:class:`ApplyOutcome`. Nothing on the machine changes before preflight passes; nothing the
running service uses changes before the new generation and the model are complete.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbuild.apply import fromimage
from envbuild.apply import generations as gens
from envbuild.apply import journal as jn
from envbuild.apply import unit as units
from envbuild.apply.checks import PreflightReport
from envbuild.apply.host import HostAccess
from envbuild.apply.imagesource import ImageSource, check_image
from envbuild.apply.inputs import ApplyInput
from envbuild.apply.integrity import check_generation, installed_unit_problems
from envbuild.apply.linkstep import check_links, link_result
from envbuild.apply.modelcache import ModelResult
from envbuild.apply.modelcache import fetch as fetch_model
from envbuild.apply.paths import Paths
from envbuild.apply.preflight import LinkResult, PreflightInput, run_preflight
from envbuild.apply.realize import (
    Found,
    RealizedGeneration,
    find_reusable,
    generation_hash,
    realize,
    repair,
)
from envbuild.apply.record import write_snapshot
from envbuild.apply.servecheck import (
    ModelCheck,
    ParseResult,
    check_command,
    check_model,
    serve_args,
)
from envbuild.apply.stateguard import state_guard
from envbuild.apply.switch import Recovery, SwitchResult, recover, switch
from envbuild.apply.venv import python_available
from envbuild.apply.wheels import wanted
from envbuild.errors import EnvbuildError, EnvironmentFailure, UserError
from envbuild.spec.checks.serve import placeholders
from envbuild.spec.model import Spec
from envbuild.store.core import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Options:
    agreed: bool = False  # --yes: stopping running units is fine
    dry_run: bool = False
    wait: float = 0.0  # seconds to wait for another apply
    health_timeout: float = 1800.0
    #: --repair: a shared generation with these inputs whose tree files were changed is put
    #: right from the wheels and reused, instead of a new one being built
    repair: bool = False
    #: --image/--from: the venv is the image's (envbuild.apply.fromimage), not installed
    image: ImageSource | None = None


@dataclass
class ApplyOutcome:
    spec: str
    origin: str
    preflight: PreflightReport
    generation: int | None = None
    generation_path: str | None = None
    reused: bool = False
    rejected: list[dict[str, Any]] = field(default_factory=list)
    model: ModelResult | None = None
    #: The other repos the unit reads (a tokenizer or config repo), fetched like the model.
    repos: list[ModelResult] = field(default_factory=list)
    #: Whether the spec has a unit (up_to_date then means "current and running").
    serves: bool = False
    switch: SwitchResult | None = None
    up_to_date: bool = False
    snapshot: str | None = None
    #: A switch that was cut short (a killed apply or rollback), undone before this apply began.
    recovered: Recovery | None = None
    #: What --repair did (one line each).
    repaired: list[str] = field(default_factory=list)
    #: --image/--from: the image and what was asked of the registry
    image: dict[str, Any] | None = None

    @property
    def exit_code(self) -> int:
        return self.preflight.exit_code

    def as_dict(self) -> dict[str, Any]:
        model = _result(self.model) if self.model is not None else None
        return {
            "spec": self.spec,
            "origin": self.origin,
            "preflight": self.preflight.as_dict(),
            "generation": self.generation,
            "generation_path": self.generation_path,
            "reused": self.reused,
            "rejected": self.rejected,
            "model": model,
            "repos": [_result(r) for r in self.repos],
            "switch": self.switch.as_dict() if self.switch else None,
            "up_to_date": self.up_to_date,
            "snapshot": self.snapshot,
            "recovered": self.recovered.as_dict() if self.recovered else None,
            "repaired": self.repaired,
            "image": self.image,
        }


def _result(m: ModelResult) -> dict[str, Any]:
    return {
        "repo": m.repo,
        "revision": m.revision,
        "path": str(m.path),
        "files": m.files,
        "size_bytes": m.size_bytes,
        "fetched": m.fetched,
        "verified": m.verified,
    }


def _envbuild_units(host: HostAccess) -> set[str]:
    return {g.meta.unit for g in gens.list_generations(host.paths) if g.meta.unit}


def apply(
    inp: ApplyInput,
    host: HostAccess,
    options: Options,
    *,
    on_preflight: Callable[[PreflightReport], None] | None = None,
    on_recovered: Callable[[Recovery], None] | None = None,
) -> ApplyOutcome:
    """Make ``inp`` the machine's current environment and service."""
    paths, services = host.paths, host.services
    # A dry run changes nothing, not even the lock file or a killed apply's leftovers.
    guard: AbstractContextManager[None] = (
        nullcontext() if options.dry_run else state_guard(paths, wait=options.wait)
    )
    with guard:
        recovered = None
        if not options.dry_run:
            gens.remove_leftovers(paths)
            _sweep_store_scratch(host)
            recovered = recover(paths, services)
            if recovered is not None and on_recovered is not None:
                on_recovered(recovered)
        spec = inp.spec
        unit = units.unit_name(spec.name) if spec.serve is not None else None
        current = gens.current(paths)
        running = sorted(
            u for u in _envbuild_units(host) if services.available and services.is_running(u)
        )
        # Does a generation with these inputs exist and still verify? (Its content hash is
        # known before anything is built when the store already holds its source builds and
        # patched wheels.) If it is the current one and its unit runs, nothing will stop.
        image = options.image
        found = fromimage.reusable(paths, inp, image, host.store) if image else _reusable(host, inp)
        if options.repair and found is not None and not options.dry_run:
            found, outcome_repairs = repair(paths, found, host.store)
        else:
            outcome_repairs = []
        keep: frozenset[str] = frozenset()
        drift: list[str] | None = None  # of the current generation's service, once looked at
        if (
            found is not None
            and found.generation is not None
            and current is not None
            and found.generation.number == current.number
        ):
            drift = _service_drift(paths, current, spec)
            if unit in running and not drift:
                keep = frozenset({unit})
        # a generation to reuse needs nothing built (nor the spec file that builds would need)
        reuse = found is not None and found.generation is not None
        store_missing = {} if reuse or image else host.wheels.missing(inp)
        parsed: ParseResult | None = None
        if reuse and unit is not None and found is not None and found.generation is not None:
            parsed = vllm_parses(found.generation, spec, paths, host.store)
        linked: LinkResult | None = None  # of a generation built before; else after the build
        if reuse and found is not None and found.generation is not None:
            linked = link_result(found.generation, spec)
        report = run_preflight(
            host.probe,
            paths,
            PreflightInput(
                spec=spec,
                unit=unit,
                keep_units=keep,
                running_units=running,
                builds_missing=store_missing,
                secrets_missing=[n for n in units.secret_names(spec) if n not in os.environ],
                python=check_image(image, inp) if image else python_available(spec.python.version),
                agreed=options.agreed,
                can_start=services.available,
                services_note=getattr(services, "reason", ""),
                rejected=[(c.number, c.problems) for c in (found.rejected if found else [])],
                pending=_pending(paths) if options.dry_run else None,
                packages=[(p.name, p.version) for p in inp.lock.packages],
                placeholders=_placeholders(inp),
                vllm_args=None if parsed is None else (parsed.ok, parsed.error),
                links=linked,
            ),
        )
        outcome = ApplyOutcome(
            spec.name, inp.origin, report, recovered=recovered, serves=unit is not None
        )
        outcome.repaired = outcome_repairs
        if on_preflight is not None:
            on_preflight(report)
        if not report.ok or options.dry_run:
            return outcome

        if found is not None and found.generation is not None:
            realized = RealizedGeneration(found.generation, True, found.rejected)
        elif image is not None:
            realized = fromimage.realize(paths, inp, image, host.store, found)
        else:
            realized = realize(paths, inp, host.wheels.provide(inp), found=found, store=host.store)
        if image is not None:
            outcome.image = {"image": image.name, **image.traffic.as_dict()}
        _record_build(outcome, realized)
        if unit is not None and parsed is None:
            # vLLM's own parser on the exact command, before the model download and the switch
            parsed = _refuse_unparsable(realized.generation, spec, paths, host.store)
        if linked is None:
            # the link check of the venv just built, before the model download and the switch
            check_links(realized.generation, spec)
        # a store root keeps the wheels its wheels/ links name through `envbuild gc`
        host.wheels.keep(realized.generation)
        if spec.model is not None:
            # every repo the unit reads, at its own pinned commit, before an offline unit starts
            fetched = [fetch_model(paths.hf_hub_cache, repo) for repo in spec.model.repos()]
            outcome.model, outcome.repos = fetched[0], fetched[1:]
            if unit is not None and parsed is not None:
                # the locked code's own model recognition on the exact command: it must load
                # what was just fetched (before the switch stops the running service)
                refuse_unloadable(realized.generation, spec, paths, parsed, fetched, host.store)
        target = realized.generation
        if drift is None and current is not None and current.number == target.number:
            drift = _service_drift(paths, current, spec)  # known only now that it is built
        if (
            current is not None
            and current.number == target.number
            and (unit is None or unit in running)
            and not drift
        ):
            outcome.up_to_date = True
            log.info(
                "generation %d is already current%s: nothing to switch",
                target.number,
                " and running" if unit is not None else "",
            )
        else:
            for problem in drift or []:
                log.warning("generation %d is current, but %s: switching again", target.number,
                            problem)  # fmt: skip
            stop = set(report.stop_units)
            if current is not None and current.meta.unit in running:
                if current.meta.unit not in stop and not options.agreed:
                    raise EnvironmentFailure(
                        f"generation {current.number} must be replaced, which restarts "
                        f"{current.meta.unit}",
                        hint="rerun with --yes to agree",
                    )
                stop.add(current.meta.unit)
            outcome.switch = switch(
                paths,
                services,
                target,
                stop_units=sorted(stop),
                env_text=units.render_env_file(spec, os.environ) if unit else None,
                health_timeout=options.health_timeout,
            )
        try:
            outcome.snapshot = write_snapshot(host, target, inp)
        except EnvbuildError as exc:  # the machine is switched; a missing record is no failure
            log.warning(
                "the snapshot beside generation %d was not written: %s", target.number, exc.message
            )
        return outcome


#: The store scratch folders apply makes (staging venvs and their uv cache, trees being made
#: or removed, a repair's lock, an image layer being unpacked): what killed applies left of them
#: the next apply removes.
SCRATCH = ("stage-", "uv-cache-", "tree-", "gone-", "repair-", "image-")


def _sweep_store_scratch(host: HostAccess) -> None:
    try:
        removed = host.store.sweep_temp(SCRATCH)
    except OSError as exc:  # a store that cannot be read: the build says so, if it needs it
        log.debug("store scratch not swept: %s", exc)
        return
    if removed:
        log.info("removed %d scratch folder(s) killed applies left in the store", removed)


def _service_drift(paths: Paths, current: gens.Generation, spec: Spec) -> list[str]:
    """What keeps the current generation's service from being as apply leaves it: its unit
    file edited or gone, or the secrets file not what the caller's environment gives now (a
    rotated token). Empty when the service is as its generation says."""
    problems = installed_unit_problems(paths, current)
    if current.meta.unit is None or not units.secret_names(spec):
        return problems
    try:
        want = units.render_env_file(spec, os.environ)
    except EnvbuildError:
        return problems  # secrets missing: preflight says so
    env_file = paths.env_file(spec.name)
    try:
        have = env_file.read_text(encoding="utf-8")
    except OSError:
        have = None
    if have != want:
        problems.append(f"secrets: {env_file} does not hold the environment's values")
    return problems


def vllm_parses(
    generation: gens.Generation, spec: Spec, paths: Paths, store: Store | None = None
) -> ParseResult:
    """The generation's vLLM parser on the unit's command (as :func:`units.render_unit` wrote
    it into the generation's unit file); its verdict kept in ``store``."""
    argv = units.exec_start(spec, generation.venv, paths.hf_hub_cache)
    result = check_command(generation, serve_args(argv), store)
    if result.cached:
        log.info("generation %d: vLLM's verdict on the unit's command is known (%s)",
                 generation.number, "accepted" if result.ok else "refused")  # fmt: skip
    return result


def refuse_unloadable(
    generation: gens.Generation,
    spec: Spec,
    paths: Paths,
    parsed: ParseResult,
    fetched: list[ModelResult],
    store: Store | None = None,
) -> ModelCheck | None:
    """Refuse (exit 2) a unit whose model the generation's locked vLLM and plugins would not
    load from what apply fetched: the reference must resolve (vLLM's and its plugins' own
    recognition) to the model's snapshot, every shard of a GGUF too, and its config to the
    config repo's snapshot (or the model's)."""
    if parsed.reference is None or not parsed.reference.get("model"):
        return None  # the parser could not be loaded: warned about already
    snapshots = [m.path for m in fetched]
    result = check_model(generation, parsed.reference, paths.hf_home, snapshots, store)
    if result.ok is None:
        log.warning("generation %d: vLLM's model loader could not be loaded, the unit's model "
                    "is not checked: %s", generation.number, result.error)  # fmt: skip
        return result
    model = parsed.reference["model"]
    problem = model_problem(result, fetched, spec)
    if problem:
        raise UserError(
            f"vLLM in generation {generation.number} would not load the unit's model {model}: "
            f"{problem}",
            hint="fix [model] (and [model.gguf]: the quant's first file as the repo names it) "
            "and apply again; nothing was switched",
        )
    log.info("generation %d: vLLM loads the unit's model from %s%s", generation.number,
             result.weights, " (known)" if result.cached else "")  # fmt: skip
    return result


def model_problem(result: ModelCheck, fetched: list[ModelResult], spec: Spec) -> str | None:
    """Why the engine would not load the model apply fetched (``result``: where the locked
    code resolves the unit's reference), or None: the locked code refuses it, or what it
    resolves to lies outside the fetched snapshots."""
    if not result.ok:
        return result.error or "refused"

    def inside(path: str | None, folder: Path) -> bool:
        return path is not None and (path == str(folder) or path.startswith(f"{folder}/"))

    own = fetched[0].path
    config_repo = spec.model.config if spec.model is not None else None
    config = next((m.path for m in fetched if config_repo and m.repo == config_repo.repo), own)
    if not inside(result.weights, own):
        return f"it resolves to {result.weights}, not into the fetched snapshot {own}"
    if result.kind == "gguf":
        outside = [s for s in result.shards if not inside(s, own)]
        if outside:
            return f"its shard {outside[0]} is not in the fetched snapshot {own}"
        match = re.search(r"-(\d+)-of-(\d+)\.gguf$", result.weights or "")
        if match and len(result.shards) != int(match.group(2)):
            return (f"the plugin finds {len(result.shards)} of its {int(match.group(2))} "
                    f"shards beside {result.weights}")  # fmt: skip
    if not inside(result.config, config):
        return f"its config resolves to {result.config or 'nothing'}, not to {config}"
    return None


def _refuse_unparsable(
    generation: gens.Generation, spec: Spec, paths: Paths, store: Store | None = None
) -> ParseResult:
    result = vllm_parses(generation, spec, paths, store)
    if result.ok is None:
        log.warning(
            "generation %d: vLLM's argument parser could not be loaded, the unit's command is "
            "not checked: %s",
            generation.number,
            result.error,
        )
    elif not result.ok:
        raise UserError(
            f"vLLM in generation {generation.number} refuses the unit's command: {result.error}",
            hint="fix serve.extra_args (or the [serve] / [model] keys) and apply again; "
            "nothing was switched",
        )
    else:
        log.info("generation %d: vLLM's parser accepts the unit's command", generation.number)
    return result


def _placeholders(inp: ApplyInput) -> list[tuple[str, str, str]]:
    """Every model repo the spec pins to the all-zero placeholder, with where it says so."""
    out = []
    for key, repo, _revision in placeholders(inp.spec):
        dotted = ".".join(key)
        if inp.loaded is not None:
            file, line = inp.loaded.where(key)
            where = f"{file}:{line}" if line else file
        else:
            where = inp.spec_path or inp.origin
        out.append((where, dotted, repo))
    return out


def _pending(paths: Paths) -> str | None:
    """For a dry run: the switch that was cut short, which a real apply undoes first."""
    j = jn.read(paths)
    if j is None:
        return None
    return f"{j.operation} (pid {j.pid}) to generation {j.target.number}, after step {j.step!r}"


def _reusable(host: HostAccess, inp: ApplyInput) -> Found | None:
    """A generation that already holds ``inp`` and still verifies, when that can be known before
    building anything: the generation a snapshot was found in, or one with the same content hash
    (computable when the store already holds every source-built and patched wheel it needs)."""
    paths = host.paths
    if inp.generation is not None:
        check = check_generation(inp.generation, store=host.store)
        return Found(
            inp.generation.meta.content_hash,
            inp.generation if check.ok else None,
            [] if check.ok else [check],
        )
    wheels = host.wheels.stored(inp) if wanted(inp) else {}
    if wheels is None:
        return None
    return find_reusable(paths, generation_hash(paths, inp, wheels), store=host.store)


def _record_build(outcome: ApplyOutcome, realized: RealizedGeneration) -> None:
    outcome.generation = realized.generation.number
    outcome.generation_path = str(realized.generation.path)
    outcome.reused = realized.reused
    outcome.rejected = [c.as_dict() for c in realized.rejected]
