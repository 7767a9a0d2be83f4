"""Realising a generation: find an identical one that still verifies, or build a new one.

A new generation is built in ``generations/.tmp-…`` (spec, lock copy, install lock, venv, unit),
checked, given its ``generation.json``, made read-only, and only then renamed to
``generations/<n>-<hash>``. A killed build leaves only a ``.tmp-`` folder, which the next apply
removes; it never leaves something that looks like a generation.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from envbuild.apply import generations as gens
from envbuild.apply import unit as units
from envbuild.apply import venv as venvs
from envbuild.apply.inputs import ApplyInput
from envbuild.apply.integrity import GenerationCheck, check_generation
from envbuild.apply.paths import Paths
from envbuild.errors import EnvironmentFailure
from envbuild.fsio import canonical_json, fsync_dir, sha256_file, write_atomic
from envbuild.snapshot import pyenv, records
from envbuild.snapshot.model.pyenv import PythonEnv

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Realised:
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


def find_reusable(paths: Paths, chash: str, mode: records.Mode = "full") -> Found:
    """The newest generation with these inputs whose files still verify, and those that do not."""
    rejected: list[GenerationCheck] = []
    for gen in reversed(gens.list_generations(paths)):
        if gen.meta.content_hash != chash:
            continue
        check = check_generation(gen, mode)
        if check.ok:
            return Found(chash, gen, rejected)
        log.warning(
            "generation %d has the same inputs but was modified (%s): it will not be reused",
            gen.number,
            "; ".join(check.problems[:3]),
        )
        rejected.append(check)
    return Found(chash, None, rejected)


def realise(
    paths: Paths,
    inp: ApplyInput,
    wheels: dict[str, venvs.StoreWheel],
    *,
    found: Found | None = None,
) -> Realised:
    """Reuse the generation ``found`` (or looked up now) for these inputs, or build one."""
    chash = generation_hash(paths, inp, wheels)
    if found is None or found.content_hash != chash:
        found = find_reusable(paths, chash)
    if found.generation is not None:
        log.info(
            "generation %d already holds this environment: reusing it", found.generation.number
        )
        return Realised(found.generation, True, found.rejected)
    return Realised(build(paths, inp, wheels, chash), False, found.rejected)


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


def build(
    paths: Paths, inp: ApplyInput, wheels: dict[str, venvs.StoreWheel], chash: str
) -> gens.Generation:
    number = gens.next_number(paths)
    final = paths.generations / gens.dir_name(number, chash)
    tmp = paths.generations / f".tmp-{number}-{chash}-{os.getpid()}"
    paths.generations.mkdir(parents=True, exist_ok=True)
    gens.remove_tree(tmp)
    tmp.mkdir()
    log.info("building generation %d (%s) from %s", number, chash[:12], inp.lock_path)
    spec = inp.spec
    write_atomic(tmp / "spec.json", canonical_json(spec.model_dump(mode="json")))
    write_atomic(tmp / "pylock.toml", inp.lock_text)
    install = tmp / venvs.INSTALL_LOCK
    venvs.link_wheels(tmp, wheels)
    write_atomic(install, venvs.install_lock(inp.lock, inp.lock_text, wheels))
    venvs.build_venv(tmp / "venv", spec.python.version, install)
    venvs.check_exact(tmp / "venv", inp.lock, wheels)
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
    scanned = pyenv.scan_env(str(tmp / "venv" / "bin" / "python"), "full")
    exceptions = _record_exceptions(scanned)
    own = ["spec.json", "pylock.toml", venvs.INSTALL_LOCK, *([unit_name] if unit_name else [])]
    meta = gens.GenerationMeta(
        number=number,
        content_hash=chash,
        spec_name=spec.name,
        spec_hash=inp.spec_hash,
        lock_sha256=inp.lock_sha256,
        created=datetime.now(UTC).replace(microsecond=0),
        python=scanned.version,
        origin=inp.origin,
        spec_path=inp.spec_path,
        lock_path=inp.lock_path,
        unit=unit_name,
        packages={d.name: d.version for d in scanned.distributions},
        files={rel: sha256_file(tmp / rel) for rel in own},
        record_exceptions=exceptions,
        interpreter=interpreter_of(tmp / "venv", final / "venv", scanned.version),
    )
    write_atomic(tmp / gens.META, canonical_json(meta.model_dump(mode="json")))
    gens.freeze(tmp)
    os.rename(tmp, final)
    fsync_dir(paths.generations)
    log.info("generation %d is complete: %s", number, final)
    return gens.Generation(number, final, meta)


def _record_exceptions(env: PythonEnv) -> dict[str, str]:
    """Files that differ from their RECORD right after uv installed them: the wheel was
    published that way (a library patched after its RECORD was written). uv checked the wheel's
    own sha256, so these bytes are the index's; they are recorded as they are, so a later check
    tells them from an edit. A missing file right after install is an error."""
    gone = [f"{d.name}: {p}" for d in env.distributions for p in d.missing]
    if gone:
        raise EnvironmentFailure(f"files are missing right after install: {'; '.join(gone[:5])}")
    out: dict[str, str] = {}
    for dist in env.distributions:
        for m in dist.modified:
            out[f"{dist.name}/{m.path}"] = sha256_file(_in_site(env, m.path))
        if dist.modified:
            log.warning(
                "%s %s: %d file(s) differ from the wheel's own RECORD as published (%s); "
                "recorded as installed",
                dist.name,
                dist.version,
                len(dist.modified),
                dist.modified[0].path,
            )
    return out


def _in_site(env: PythonEnv, rel: str) -> Path:
    for site in env.site_packages:
        if (Path(site) / rel).exists():
            return Path(site) / rel
    raise EnvironmentFailure(f"{rel} is not in {env.site_packages}")
