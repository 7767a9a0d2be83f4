"""Is a generation still what was built? Its own files against the digests in
``generation.json``, and every file of its venv against the RECORD its installer wrote (the
snapshot stage's :func:`~envbuild.snapshot.pyenv.scan_env`), plus the exact set of distributions.

This is what catches a hand-patched venv (the stale-patch case): such a generation is reported
and never reused.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbuild.apply import shared
from envbuild.apply.generations import Generation
from envbuild.apply.paths import Paths
from envbuild.errors import EnvbuildError
from envbuild.fsio import sha256_bytes, sha256_file
from envbuild.snapshot import pyenv, records
from envbuild.store.core import Store, default_store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationCheck:
    number: int
    name: str
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {"number": self.number, "name": self.name, "ok": self.ok, "problems": self.problems}


def _sha256_in(sites: list[str], rel: str) -> str | None:
    for site in sites:
        path = Path(site) / rel
        if path.is_file():
            return sha256_file(path)
    return None


def check_generation(
    gen: Generation,
    mode: records.Mode = "full",
    *,
    store: Store | None = None,
    memo: dict[str, list[str] | None] | None = None,
    links: Mapping[str, list[int]] | None = None,
) -> GenerationCheck:
    """Is ``gen`` still what was built? A generation assembled from install trees is checked
    by :func:`envbuild.apply.shared.check` (each tree once per ``memo``, in ``store``: default
    :func:`~envbuild.store.core.default_store`); an older one against its RECORDs."""
    problems: list[str] = []
    for rel, digest in sorted(gen.meta.files.items()):
        path = gen.path / rel
        try:
            actual = sha256_file(path)
        except OSError as exc:
            problems.append(f"{rel}: {exc.strerror or exc}")
            continue
        if actual != digest:
            problems.append(f"{rel} was modified")
    python = gen.venv / "bin" / "python"
    problems.extend(_interpreter_problems(gen))
    if gen.meta.trees:
        store = store or default_store()
        problems.extend(shared.check(gen, store, mode, memo=memo, links=links))
        if problems:
            log.warning("generation %d was changed after it was built: %s", gen.number, problems[0])
        return GenerationCheck(gen.number, gen.name, problems)
    try:
        env = pyenv.scan_env(str(python), mode)
    except EnvbuildError as exc:
        problems.append(f"venv: {exc.message}")
        return GenerationCheck(gen.number, gen.name, problems)
    want = gen.meta.interpreter
    if want is not None and env.version != want.version:
        problems.append(f"interpreter: venv/bin/python is Python {env.version}, was {want.version}")
    have = {d.name: d.version for d in env.distributions}
    for name, version in sorted(gen.meta.packages.items()):
        if name not in have:
            problems.append(f"venv: {name} {version} is gone")
        elif have[name] != version:
            problems.append(f"venv: {name} is {have[name]}, was {version}")
    for name in sorted(set(have) - set(gen.meta.packages)):
        problems.append(f"venv: {name} {have[name]} was installed after the build")
    known = gen.meta.record_exceptions
    for dist in env.distributions:
        for m in dist.modified:
            key = f"{dist.name}/{m.path}"
            if key in known and _sha256_in(env.site_packages, m.path) == known[key]:
                continue  # as installed: the wheel was published with this RECORD mismatch
            problems.append(f"venv: {dist.name}: {m.path} was modified")
        problems.extend(f"venv: {dist.name}: {p} is missing" for p in dist.missing)
        problems.extend(f"venv: {dist.name}: {p} was added" for p in dist.unrecorded)
    problems.extend(f"venv: {p} belongs to no distribution" for p in env.unowned)
    if problems:
        log.warning("generation %d was changed after it was built: %s", gen.number, problems[0])
    return GenerationCheck(gen.number, gen.name, problems)


def _interpreter_problems(gen: Generation) -> list[str]:
    """venv/bin/python must still lead to the binary it led to at build time (a repointed
    symlink or a rebuilt interpreter of the same version runs other code)."""
    want = gen.meta.interpreter
    if want is None:
        return []
    try:
        real = (gen.venv / "bin" / "python").resolve(strict=True)
        digest = sha256_file(real)
    except (OSError, RuntimeError) as exc:
        return [f"interpreter: venv/bin/python: {getattr(exc, 'strerror', None) or exc}"]
    problems = []
    if str(real) != want.path:
        problems.append(f"interpreter: venv/bin/python leads to {real}, was {want.path}")
    if digest != want.sha256:
        problems.append(
            f"interpreter: {real} is not the binary the generation was built with (sha256 "
            f"{digest[:12]}…, was {want.sha256[:12]}…)"
        )
    return problems


def installed_unit_problems(paths: Paths, gen: Generation) -> list[str]:
    """The current generation's unit as systemd has it must be the generation's own copy: a unit
    edited (or removed) after apply would otherwise run other settings than the spec says."""
    source = gen.unit_file()
    if source is None or gen.meta.unit is None:
        return []
    installed = paths.unit_file(gen.meta.unit)
    try:
        have = installed.read_bytes()
    except FileNotFoundError:
        return [f"unit: {installed} is missing"]
    except OSError as exc:
        return [f"unit: {installed}: {exc.strerror or exc}"]
    want = gen.meta.files.get(gen.meta.unit)  # as built (check_generation checks the copy)
    if want is None:
        try:
            want = sha256_bytes(source.read_bytes())
        except OSError:
            return []
    if sha256_bytes(have) != want:
        return [f"unit: {installed} was modified (it is not generation {gen.number}'s unit)"]
    return []
