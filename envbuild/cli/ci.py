"""`envbuild ci [SPEC...]`: check every lock, build every image, push, and write a summary."""

from __future__ import annotations

import argparse
from pathlib import Path

from envbuild.build.layers import Compression
from envbuild.ci import BuildOutput, discover_specs, human_size, run_ci, summary_markdown
from envbuild.cli import render
from envbuild.cli.build import add_builder_args, add_compression_arg
from envbuild.cli.cacheopts import add_cache_args, store_with_cache
from envbuild.cli.engineopts import docker_engine
from envbuild.cli.registryopts import add_registry_args, endpoint_from_args
from envbuild.fsio import write_atomic
from envbuild.registry import compat as engines
from envbuild.registry.core import get_transport
from envbuild.registry.ref import parse_repo
from envbuild.spec.load import LoadedSpec, find_root
from envbuild.store.core import Store, default_store


def register(p: argparse.ArgumentParser) -> None:
    p.description = (
        "For each SPEC (default: every specs/*.toml of the repository): check its "
        "lock is current, build its image, push it to REGISTRY/REPO:<spec name> with --push, "
        "and write a summary table (spec, image digest, size, layers reused vs new) to "
        "--summary. Exit code: 0 all built, 1 a lock is stale, 2/3 a spec or build failed."
    )
    p.add_argument("specs", nargs="*", metavar="SPEC", type=Path)
    p.add_argument("--push", metavar="REGISTRY/REPO", help="push each image, tagged by spec name")
    add_cache_args(p)
    p.add_argument("--summary", metavar="FILE", type=Path, help="write the markdown summary here")
    p.add_argument("--store", metavar="DIR", type=Path, help="the store (default: $ENVBUILD_STORE)")
    add_compression_arg(p)
    add_builder_args(p)
    add_registry_args(p)
    render.add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    push = parse_repo(args.push, what="--push") if args.push else None
    specs = args.specs or discover_specs(find_root(Path.cwd() / "specs"))
    endpoint = endpoint_from_args(args)
    store = Store(args.store) if args.store else default_store()
    engine = docker_engine()
    transport = get_transport(args.transport, engine) if (push or args.cache) else None
    store = store_with_cache(store, args, endpoint, transport)
    from envbuild.pipeline.core import BuilderOptions, build

    builder = BuilderOptions(mode=args.builder, network=args.builder_network, engine=engine)

    def build_one(loaded: LoadedSpec, store: Store) -> BuildOutput:
        return build(
            loaded,
            store=store,
            builder=builder,
            docker_archive=args.docker_archive,
            compression=Compression(args.compression),
        )

    report = run_ci(
        specs, store=store, push=push, endpoint=endpoint, transport=transport, build_fn=build_one
    )
    if args.summary:
        write_atomic(args.summary, summary_markdown(report))
    if args.json:
        render.emit_json(report.as_dict())
        return report.exit_code
    if push and (note := engines.compression_note(args.compression)):
        render.echo(note)
    for o in report.outcomes:
        name = o.name or o.spec
        if o.image is None:
            why = "lock is stale" if o.lock == "stale" else "failed"
            render.echo(f"{name}: {why}")
            for line in o.lock_changes + o.error:
                render.echo(f"  {line}")
            continue
        render.echo(
            f"{name}: {o.image} ({human_size(o.size or 0)}), layers {o.layers_reused} reused, "
            f"{o.layers_new} new"
        )
        if o.pushed:
            render.echo(
                f"  pushed {o.pushed}: {o.blobs_uploaded} blobs uploaded, {o.blobs_skipped} "
                "already in the registry"
            )
    return report.exit_code
