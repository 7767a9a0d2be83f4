"""Checks of source builds: their flags (counts are positive whole numbers, for every build),
and whether their CUDA arch lists cover the target GPUs and hold only archs the toolkit can
compile."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

from packaging.version import Version

from envbuild.errors import Problem
from envbuild.spec import archs, facts
from envbuild.spec import knowledge as kb
from envbuild.spec.checks.core import WARNING, SpecGpu, capabilities
from envbuild.spec.load import LoadedSpec
from envbuild.spec.locate import KeyPath

log = logging.getLogger(__name__)

#: Build flags that are counts for every build (envbuild.sourcebuild.realize refuses the same values
#: when a build runs).
INT_ENV = ("MAX_JOBS", "NVCC_THREADS")


def is_count(value: str) -> bool:
    """A positive whole number, written plainly (``8``, not ``08``, ``+8`` or ``8.0``)."""
    return re.fullmatch(r"[1-9][0-9]*", value) is not None


def source_builds(loaded: LoadedSpec, gpus: list[SpecGpu]) -> Iterator[Problem]:
    spec = loaded.spec
    ccs = capabilities(gpus)
    toolkit = kb.toolkit_archs(spec.cuda.version) if spec.cuda else None
    for name, build in spec.builds.items():
        key: KeyPath = ("builds", name)
        fact = kb.source_build(name, build.version)
        lists: list[tuple[KeyPath, str, list[archs.ArchRequest]]] = []
        yield from _whole_numbers(loaded, key, build.env, fact)
        if fact is not None:
            yield from _known_build(loaded, key, name, build.env, fact)
            if fact.arch_env:
                value = build.env.get(fact.arch_env, fact.arch_default or "")
                where = (*key, "env", fact.arch_env) if fact.arch_env in build.env else key
                found, bad = archs.parse_list(fact.arch_env, value, fact.arch_format)
                for item in bad:
                    yield loaded.problem(where, item.message, item.hint)
                yield from _accepted(loaded, where, name, build.version, fact, found)
                lists.append((where, fact.arch_env, found))
        tal = facts.knowledge().torch_cuda_arch_list.env
        if tal in build.env:
            found, bad = archs.parse_list(tal, build.env[tal], "torch")
            for item in bad:
                yield loaded.problem((*key, "env", tal), item.message, item.hint)
            lists.append(((*key, "env", tal), tal, found))
        if not lists:
            yield loaded.problem(
                key,
                f"{name} names no CUDA arch list; a build in a container without GPUs then "
                "compiles for torch's default archs",
                f'set env.{tal} = "{";".join(ccs) or "12.0"}"',
                severity=WARNING,
            )
        for where, env, found in lists:
            missing = archs.uncovered(found, ccs)
            if missing:
                shown = "; ".join(str(a) for a in found) or "nothing"
                yield loaded.problem(
                    where,
                    f"{env} ({shown}) does not cover the host's compute capability "
                    f"{', '.join(missing)}",
                    f"add {', '.join(_spell(env, fact, cc) for cc in missing)} to {env}",
                )
            if toolkit and spec.cuda:
                bad_archs = sorted(
                    {r.arch.cc for r in found if r.arch.cc not in toolkit.archs},
                    key=Version,
                )
                if bad_archs:
                    yield loaded.problem(
                        where,
                        f"CUDA {spec.cuda.version} cannot compile for {', '.join(bad_archs)} "
                        f"(it compiles {toolkit.archs[0]} to {toolkit.archs[-1]})",
                        f"remove {', '.join(bad_archs)} from {env}, or use an older toolkit",
                    )


def _spell(env: str, fact: facts.SourceBuildFact | None, cc: str) -> str:
    """How to write an arch that covers ``cc`` in ``env``'s format."""
    if fact is None or env != fact.arch_env or fact.arch_format != "sm":
        return repr(cc)
    major, minor = (int(p) for p in cc.split("."))
    if fact.arch_accepted is None:
        return repr(f"{major}{minor}")
    fits = [
        a
        for a in fact.arch_accepted
        if a.isdigit() and int(a[:-1]) == major and int(a[-1]) <= minor
    ]
    return repr(max(fits, key=int)) if fits else repr(f"{major}{minor}")


def _known_build(
    loaded: LoadedSpec, key: KeyPath, name: str, env: dict[str, str], fact: facts.SourceBuildFact
) -> Iterator[Problem]:
    if fact.force_build_env and env.get(fact.force_build_env) != fact.force_build_value:
        yield loaded.problem(
            (*key, "env", fact.force_build_env) if fact.force_build_env in env else key,
            f"without {fact.force_build_env}={fact.force_build_value} {name}'s setup.py "
            "downloads a prebuilt wheel from GitHub instead of building from source",
            f'set env.{fact.force_build_env} = "{fact.force_build_value}"',
        )


def _whole_numbers(
    loaded: LoadedSpec, key: KeyPath, env: dict[str, str], fact: facts.SourceBuildFact | None
) -> Iterator[Problem]:
    """MAX_JOBS and NVCC_THREADS (and what the knowledge base adds) of any build are counts."""
    for var in dict.fromkeys([*INT_ENV, *(fact.int_env if fact else [])]):
        if var in env and not is_count(env[var]):
            yield loaded.problem(
                (*key, "env", var),
                f"{var} must be a positive whole number, not {env[var]!r}",
                f'write it like {var} = "8"',
            )


def _accepted(
    loaded: LoadedSpec,
    where: KeyPath,
    name: str,
    version: str,
    fact: facts.SourceBuildFact,
    found: list[archs.ArchRequest],
) -> Iterator[Problem]:
    spec = loaded.spec
    for request in found:
        arch, sm = request.arch, request.arch.number
        if fact.arch_accepted is not None and sm not in fact.arch_accepted:
            yield loaded.problem(
                where,
                f"{name} {version} ignores {sm!r} in {fact.arch_env}: its setup.py builds only "
                f"{', '.join(fact.arch_accepted)}",
                f"use {' / '.join(fact.arch_accepted)} (code for {arch.major}0 runs on every "
                f"{arch.major}.x GPU)",
            )
        need = fact.arch_min_cuda.get(sm)
        if need and spec.cuda and Version(spec.cuda.version) < Version(need):
            yield loaded.problem(
                where,
                f"{name} builds {sm} only with CUDA >= {need}; the toolkit is {spec.cuda.version}",
                f'set cuda.version = "{need}" or newer',
            )
