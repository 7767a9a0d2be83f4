"""`envbuild pull REGISTRY/REPO[:TAG|@DIGEST] DIR`: an image into a new OCI layout, verified."""

from __future__ import annotations

import argparse
from pathlib import Path

from envbuild.ci import human_size
from envbuild.cli import render
from envbuild.cli.engineopts import docker_engine
from envbuild.cli.registryopts import add_registry_args, endpoint_from_args
from envbuild.errors import ExitCode
from envbuild.registry.core import get_transport, pull
from envbuild.registry.ref import parse_ref


def register(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Pull REGISTRY/REPO:TAG (or @sha256:DIGEST) into the new folder DIR as an "
        "OCI image layout. The manifest digest and the sha256 of every blob are checked; a "
        "copy that does not match is refused and DIR is not created."
    )
    p.add_argument("source", metavar="REGISTRY/REPO[:TAG|@DIGEST]")
    p.add_argument("dest", metavar="DIR", type=Path, help="a folder that does not exist yet")
    add_registry_args(p)
    render.add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    source = parse_ref(args.source, what="pull source")
    endpoint = endpoint_from_args(args)
    result = pull(
        source,
        args.dest,
        endpoint=endpoint,
        transport=get_transport(args.transport, docker_engine()),
    )
    if args.json:
        render.emit_json(result.as_dict())
    else:
        render.echo(f"pulled {result.ref} into {result.path}")
        render.echo(f"digest: {result.digest}")
        if result.layout_digest != result.digest:
            render.echo(f"layout digest: {result.layout_digest} (layers as the engine saved them)")
        render.echo(f"verified: {result.blobs} blobs, {human_size(result.size)}")
    return ExitCode.OK
