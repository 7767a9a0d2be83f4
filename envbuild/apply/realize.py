"""Realizing a generation: find an identical one that still verifies, or build a new one.

A new generation is built in ``generations/.tmp-…`` (spec, lock copy, install lock, venv, unit),
checked, given its ``generation.json``, made read-only, and only then renamed to
``generations/<n>-<hash>``. A killed build leaves only a ``.tmp-`` folder, which the next apply
removes; it never leaves something that looks like a generation.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from envbuild.apply import generations as gens
from envbuild.apply import shared
from envbuild.apply import unit as units
from envbuild.apply import venv as venvs
from envbuild.apply.assemble import Assembler
from envbuild.apply.inputs import ApplyInput
from envbuild.apply.integrity import GenerationCheck, check_generation
from envbuild.apply.paths import Paths
from envbuild.errors import EnvironmentFailure
from envbuild.fsio import canonical_json, fsync_dir, sha256_file, write_atomic
from envbuild.snapshot import pyenv, records
from envbuild.store.core import Store, default_store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RealizedGeneration:
    generation: gens.Generation
    reused: bool
    #: Generations with the same content that failed their check (edited after the build).
    rejected: list[GenerationCheck] = field(default_factory=list)


def generation_hash(paths: Paths, inp: ApplyInput, wheels: dict[str, venvs.StoreWheel]) -> str:
    return gens.content_hash(
        lock_text=inp.lock_text,
        spec_hash=inp.spec_hash,
        store_wheels={name: w.sha256 for name, w in wheels.items()},
        machine={"hf_home": str(paths.hf_home), "secrets": str(paths.secrets)},
    )


@dataclass(frozen=True)
class Found:
    """What the state dir holds for one content hash."""

    content_hash: str
    generation: gens.Generation | None  # the newest one that still verifies
    rejected: list[GenerationCheck] = field(default_factory=list)


def find_reusable(
    paths: Paths, chash: str, mode: records.Mode = "full", *, store: Store | None = None
) -> Found:
    """The newest generation with these inputs whose files still verify, and those that do not."""
    rejected: list[GenerationCheck] = []
    every = gens.list_generations(paths)
    memo: dict[str, list[str] | None] = {}
    links = shared.linked_by(every)
    for gen in reversed(every):
        if gen.meta.content_hash != chash:
            continue
        check = check_generation(gen, mode, store=store, memo=memo, links=links)
        if check.ok:
            return Found(chash, gen, rejected)
        log.warning(
            "generation %d has the same inputs but was modified (%s): it will not be reused",
            gen.number,
            "; ".join(check.problems[:3]),
        )
        rejected.append(check)
    return Found(chash, None, rejected)


def repair(paths: Paths, found: Found, store: Store) -> tuple[Found, list[str]]:
    """``apply --repair``: the newest generation with these inputs that failed its check, its
    install trees installed again from their wheels and its files linked again (and those of
    every generation that links the same trees); reused if it then verifies."""
    if found.generation is not None or not found.rejected:
        return found, []
    newest = found.rejected[0]
    every = gens.list_generations(paths)
    gen = next((g for g in every if g.number == newest.number), None)
    if gen is None or not gen.meta.trees or gen.meta.image:
        # not a shared generation of wheels (one from an image has no wheels to install
        # again): it is built again instead
        return found, []
    done = shared.repair(gen, Store(store.root), every, gen.meta.python.rsplit(".", 1)[0])
    check = check_generation(gen, store=store)
    if check.ok:
        log.info("generation %d repaired: %s", gen.number, "; ".join(done) or "nothing to do")
        return Found(found.content_hash, gen, found.rejected[1:]), done
    log.warning("generation %d is still modified after repair: %s", gen.number, check.problems[0])
    return Found(found.content_hash, None, [check, *found.rejected[1:]]), done


def realize(
    paths: Paths,
    inp: ApplyInput,
    wheels: dict[str, venvs.StoreWheel],
    *,
    found: Found | None = None,
    store: Store | None = None,
) -> RealizedGeneration:
    """Reuse the generation ``found`` (or looked up now) for these inputs, or build one from
    the install trees of ``store`` (default: :func:`~envbuild.store.core.default_store`)."""
    chash = generation_hash(paths, inp, wheels)
    if found is None or found.content_hash != chash:
        found = find_reusable(paths, chash)
    if found.generation is not None:
        log.info(
            "generation %d already holds this environment: reusing it", found.generation.number
        )
        return RealizedGeneration(found.generation, True, found.rejected)
    store = Store((store or default_store()).root)  # trees are local: no remote cache
    return RealizedGeneration(
        build_generation(paths, inp, wheels, chash, store), False, found.rejected
    )


def interpreter_of(venv: Path, final_venv: Path, version: str) -> gens.Interpreter:
    """The binary ``venv/bin/python`` leads to. A venv that copies its interpreter (no symlink
    out) records it at the path it has once the generation is in place."""
    real = (venv / "bin" / "python").resolve()
    path = (
        final_venv / real.relative_to(venv.resolve())
        if real.is_relative_to(venv.resolve())
        else real
    )
    return gens.Interpreter(path=str(path), version=version, sha256=sha256_file(real))


def build_generation(
    paths: Paths,
    inp: ApplyInput,
    wheels: dict[str, venvs.StoreWheel],
    chash: str,
    store: Store,
) -> gens.Generation:
    draft = start_generation(paths, inp, chash, str(inp.lock_path))
    number, final, tmp = draft.number, draft.final, draft.tmp
    spec = inp.spec
    install = tmp / venvs.INSTALL_LOCK
    venvs.link_wheels(tmp, wheels)
    write_atomic(install, venvs.install_lock(inp.lock, inp.lock_text, wheels))
    with store.session():  # gc waits: no tree goes before the generation's root names it
        assembled = Assembler(store, spec.python.version).assemble(
            tmp / "venv", install, spec.image.overlaps
        )
        packages = venvs.check_exact(tmp / "venv", inp.lock, wheels)
        unit_name = None
        if spec.serve is not None:
            unit_name = units.unit_name(spec.name)
            if not (tmp / "venv" / "bin" / "vllm").exists():
                raise EnvironmentFailure(
                    f"[serve] runs `vllm serve`, but the lock installs no vllm command "
                    f"({inp.lock_path})",
                    hint="add [vllm] to the spec and lock it again",
                )
            text = units.render_unit(
                spec,
                inp.spec_hash,
                units.ServeSettings(
                    generation=number,
                    generation_path=final,
                    venv=final / "venv",
                    hf_home=paths.hf_home,
                    env_file=paths.env_file(spec.name),
                ),
            )
            write_atomic(tmp / unit_name, text)
        version = pyenv.probe(str(tmp / "venv" / "bin" / "python")).version
        own = ["spec.json", "pylock.toml", venvs.INSTALL_LOCK, *([unit_name] if unit_name else [])]
        own += shared.link_manifests(tmp, store, assembled.trees)
        meta = gens.GenerationMeta(
            number=number,
            content_hash=chash,
            spec_name=spec.name,
            spec_hash=inp.spec_hash,
            lock_sha256=inp.lock_sha256,
            created=datetime.now(UTC).replace(microsecond=0),
            python=version,
            origin=inp.origin,
            spec_path=inp.spec_path,
            lock_path=inp.lock_path,
            unit=unit_name,
            packages=packages,
            files={rel: sha256_file(tmp / rel) for rel in own},
            interpreter=interpreter_of(tmp / "venv", final / "venv", version),
            record_exceptions=assembled.as_published,
            trees=assembled.trees,
            overlaps=assembled.winners,
            link_mode=assembled.link_mode,
            venv_files=shared.own_files(tmp / "venv", assembled.own),
        )
        gen = finish_generation(
            paths, draft, meta, store, assembled.trees.values(), assembled.choices
        )
    log.info(
        "generation %d is complete: %s (%d distributions, %d installed now, files %s)",
        number, final, len(assembled.trees), len(assembled.made), assembled.link_mode + "ed",
    )  # fmt: skip
    return gen


@dataclass(frozen=True)
class Draft:
    """A generation being made: its number, the folder it will be, the one it is made in."""

    number: int
    final: Path
    tmp: Path


def start_generation(paths: Paths, inp: ApplyInput, chash: str, source: str) -> Draft:
    """The next generation's folder, made empty under a temporary name, with the spec and the
    lock it is made from (the same for a generation from wheels and one from an image)."""
    number = gens.next_number(paths)
    final = paths.generations / gens.dir_name(number, chash)
    tmp = paths.generations / f".tmp-{number}-{chash}-{os.getpid()}"
    paths.generations.mkdir(parents=True, exist_ok=True)
    gens.remove_tree(tmp)
    tmp.mkdir()
    log.info("building generation %d (%s) from %s", number, chash[:12], source)
    write_atomic(tmp / "spec.json", canonical_json(inp.spec.model_dump(mode="json")))
    write_atomic(tmp / "pylock.toml", inp.lock_text)
    return Draft(number, final, tmp)


def finish_generation(
    paths: Paths,
    draft: Draft,
    meta: gens.GenerationMeta,
    store: Store,
    trees: Iterable[str],
    derivations: Iterable[str] = (),
) -> gens.Generation:
    """Write ``meta`` last, make the folder read-only, root its trees (and ``derivations``) in
    the store, and give it its name: only then is it a generation. Call in a store session."""
    write_atomic(draft.tmp / gens.META, canonical_json(meta.model_dump(mode="json")))
    shared.freeze(draft.tmp, meta.venv_files)
    store.set_root(
        shared.root_name(draft.final), trees=trees, derivations=derivations, generation=draft.final
    )
    os.rename(draft.tmp, draft.final)
    fsync_dir(paths.generations)
    return gens.Generation(draft.number, draft.final, meta)
