"""`envbuild store {plan,add-wheel,ls,path,verify}`: source builds and patched wheels in the
store, and a full check of every blob."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envbuild.cli import render
from envbuild.cli.cacheopts import add_cache_args, store_with_cache
from envbuild.cli.engineopts import docker_engine
from envbuild.cli.registryopts import add_registry_args, endpoint_from_args
from envbuild.errors import ExitCode, UsageError
from envbuild.pipeline.core import BuilderOptions, source_builder
from envbuild.sourcebuild.stored import (
    STATE_TEXT,
    add_wheel_for_spec,
    state_of,
    store_plan_for_spec,
    stored_outputs,
)
from envbuild.store.core import Store, default_store
from envbuild.store.verify import verify

log = logging.getLogger(__name__)


def _store_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--store",
        metavar="DIR",
        help="the store (default: $ENVBUILD_STORE, else ~/.cache/envbuild/store)",
    )


def register(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Source builds (flash-attn …) and patched wheels are derivations in the store, "
        "keyed by every input. These commands show and manage them."
    )
    group = p.add_subparsers(dest="store_command", metavar="STORE_COMMAND", required=True)

    plan = group.add_parser(
        "plan",
        help="what the spec's source builds and patches will cost, and whether they are needed",
        description="For each source build and patch of SPEC: its flags and inputs, its key, "
        "whether it is cached in the store, in the remote cache (--cache) or to be built; for "
        "a source build also the toolchain (the nvcc it would run, warned about when its CUDA "
        "is not the spec's cuda.version), MAX_JOBS and the estimated peak memory (warned about "
        "when a pinned MAX_JOBS would not fit). Builds nothing.",
    )
    plan.add_argument("spec", metavar="SPEC", type=Path)
    plan.add_argument(
        "--builder",
        choices=["host", "container"],
        default="host",
        help="the builder whose key and toolchain to show (container: the image's lower layers "
        "are built first, or found in the store)",
    )
    _store_flag(plan)
    add_cache_args(plan)
    add_registry_args(plan)
    render.add_json_flag(plan)
    plan.set_defaults(func=_plan)

    add = group.add_parser(
        "add-wheel",
        help="record a wheel built elsewhere as SPEC's build of DIST (audited first)",
        description="Audit WHEEL's GPU code against SPEC's GPUs and record it under the input key "
        "a build here would have (same sdist, torch, Python, compilers, flags), so `envbuild "
        "build` reuses it instead of compiling.",
    )
    add.add_argument("spec", metavar="SPEC", type=Path)
    add.add_argument("dist", metavar="DIST", help="the distribution SPEC builds, e.g. flash-attn")
    add.add_argument("wheel", metavar="WHEEL", type=Path)
    add.add_argument(
        "--builder",
        choices=["host", "container"],
        default="host",
        help="key it as `envbuild build --builder …` would build it (container: the image's "
        "lower layers are built first, or found in the store; the engine is $DOCKER_HOST)",
    )
    _store_flag(add)
    render.add_json_flag(add)
    add.set_defaults(func=_add)

    ls = group.add_parser("ls", help="list the source builds and patched wheels in the store")
    _store_flag(ls)
    render.add_json_flag(ls)
    ls.set_defaults(func=_ls)

    path = group.add_parser(
        "path",
        help="print the stored wheel (or --log) of DIST or KEY (a prefix will do), or the path "
        "of the blob sha256:DIGEST",
    )
    path.add_argument("which", metavar="DIST|KEY|sha256:DIGEST")
    path.add_argument("--log", action="store_true", help="the build log instead of the wheel")
    _store_flag(path)
    path.set_defaults(func=_path)

    verify = group.add_parser(
        "verify",
        help="hash every blob and check every derivation record (exit 1 when one is wrong)",
        description="Hash every blob of the store (in parallel) and check every derivation "
        "record and its outputs. Builds check a blob only when its stat changed since it was "
        "hashed; this finds what no stat shows (a damaged disk). Exit 0: all good; 1: something "
        "was wrong (with --repair: and was removed, so that the next build makes or fetches it "
        "again).",
    )
    verify.add_argument(
        "--repair",
        action="store_true",
        help="remove corrupt blobs (restoring them from an output folder that holds them) and "
        "the derivation records that lost an output; give blobs their mode 0444 back",
    )
    verify.add_argument(
        "--jobs", type=int, metavar="N", help="blobs hashed at once (default: CPUs, at most 8)"
    )
    _store_flag(verify)
    render.add_json_flag(verify)
    verify.set_defaults(func=_verify)


def _store(args: argparse.Namespace) -> Store:
    return Store(args.store) if args.store else default_store()


def _plan(args: argparse.Namespace) -> int:
    store = _store(args)
    if args.cache:
        store = store_with_cache(store, args, endpoint_from_args(args))
    options = BuilderOptions(mode=args.builder, engine=docker_engine())
    planned, costs = store_plan_for_spec(
        args.spec, store, builder=lambda loaded: source_builder(loaded, store, options)
    )
    by_dist = {c.dist: c for c in costs}
    rows: list[dict[str, Any]] = []
    for p in planned:
        row = p.model_dump(mode="json")
        cost = by_dist.get(p.dist) if p.kind == "source-build" else None
        if cost is not None:
            row |= cost.model_dump(mode="json", exclude={"dist", "version"})
        elif p.key:
            row["state"] = state_of(store, p.key)
        rows.append(row)
    if args.json:
        render.emit_json(rows)
        return ExitCode.OK
    if not planned:
        render.echo("no source builds and no patches")
    for p, row in zip(planned, rows, strict=True):
        render.echo(f"{p.kind} {p.dist}: {p.summary}")
        if row.get("key"):
            render.echo(f"  key {row['key']}: {STATE_TEXT[row['state']]}")
        cost = by_dist.get(p.dist) if p.kind == "source-build" else None
        if cost is None:
            continue
        compilers = " ".join(f"{k} {v}" for k, v in sorted(cost.compilers.items()))
        render.echo(f"  builder {cost.builder.get('mode')}: Python {cost.python}, {compilers}")
        if cost.nvcc:
            render.echo(f"  nvcc {cost.nvcc.path} (CUDA {cost.nvcc.cuda})")
        render.echo(f"  memory: {cost.memory.render()}")
        for w in cost.warnings:
            render.problem_lines([f"warning: {w}"])
    return ExitCode.OK


def _add(args: argparse.Namespace) -> int:
    store = _store(args)
    options = BuilderOptions(mode=args.builder, engine=docker_engine())
    result = add_wheel_for_spec(
        args.spec,
        args.dist,
        args.wheel,
        store,
        builder=lambda loaded: source_builder(loaded, store, options),
    )
    if args.json:
        render.emit_json(result.model_dump(mode="json"))
        return ExitCode.OK
    render.echo(f"added {result.wheel} as {result.dist} {result.version} (key {result.key})")
    render.echo(f"audit: {result.audit.summary()}")
    return ExitCode.OK


def _ls(args: argparse.Namespace) -> int:
    outputs = stored_outputs(_store(args))
    if args.json:
        render.emit_json([o.model_dump(mode="json") for o in outputs])
        return ExitCode.OK
    for o in outputs:
        archs = " ".join([*o.sass, *o.ptx]) or "-"
        render.echo(
            f"{o.key[:12]}  {o.kind:<12} {o.dist} {o.version}  {o.origin:<7} "
            f"{o.builder or '-':<9} {archs}  {o.wheel}"
        )
    return ExitCode.OK


def _path(args: argparse.Namespace) -> int:
    store = _store(args)
    if args.which.startswith("sha256:"):
        blob = _one(args.which, store.find(args.which), "blobs", lambda d: d)
        render.echo(str(store.blob_path(blob)))
        return ExitCode.OK
    outputs = {o.key: o for o in stored_outputs(store)}
    keys = sorted(k for k, o in outputs.items() if o.dist == args.which)
    keys = keys or [k for k in store.find(args.which) if k in outputs]
    key = _one(
        args.which,
        keys,
        "stored builds",
        lambda k: f"{k[:12]} ({outputs[k].dist} {outputs[k].version})",
    )
    o = outputs[key]
    digest = o.log_digest if args.log else o.wheel_digest
    if digest is None:
        raise UsageError(f"{o.dist} {o.version} has no build log (it was added, not built here)")
    render.echo(str(store.blob_path(digest)))
    return ExitCode.OK


def _one(which: str, found: list[str], what: str, name: Callable[[str], str]) -> str:
    """The one thing ``which`` names; a usage error (exit 2) naming the candidates when it
    names none or several."""
    if len(found) == 1:
        return found[0]
    named = f": {', '.join(name(f) for f in found)}" if found else ""
    raise UsageError(
        f"{which!r} names {len(found)} {what}{named}",
        hint="give the key (or a longer prefix): `envbuild store ls` lists them",
    )


def _verify(args: argparse.Namespace) -> int:
    store = _store(args)
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: give 1 or more")
    result = verify(store, repair=args.repair, workers=args.jobs)
    if args.json:
        render.emit_json({"store": str(store.root), **result.as_dict()})
    else:
        for problem in result.problems:
            render.echo(problem.render())
        state = "ok" if result.ok else f"{len(result.corrupt)} corrupt blob(s), "
        if not result.ok:
            if result.bad_modes:
                state += f"{len(result.bad_modes)} blob(s) of a wrong mode, "
            state += f"{len(result.broken)} broken derivation(s)"
            state += ", repaired" if result.repaired else "; run with --repair to remove them"
        render.echo(
            f"checked {result.checked} blobs ({result.checked_bytes / 1e6:,.1f} MB) and "
            f"{result.derivations} derivations in {store.root}: {state}"
        )
    return ExitCode.OK if result.ok else ExitCode.DIFFERENT
