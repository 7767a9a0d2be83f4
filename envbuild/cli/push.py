"""`envbuild push DIR REGISTRY/REPO:TAG`: copy an OCI image layout to a registry."""

from __future__ import annotations

import argparse
from pathlib import Path

from envbuild.ci import human_size
from envbuild.cli import render
from envbuild.cli.engineopts import docker_engine
from envbuild.cli.registryopts import add_registry_args, endpoint_from_args
from envbuild.errors import ExitCode
from envbuild.registry import compat as engines
from envbuild.registry.core import PushResult, get_transport, push
from envbuild.registry.ref import parse_ref


def describe_push(result: PushResult) -> list[str]:
    up, skip = result.uploaded, result.skipped
    line = f"blobs: {len(up)} uploaded ({human_size(result.bytes_uploaded)})"
    if skip:
        line += (
            f", {len(skip)} already in the registry, not uploaded again "
            f"({human_size(result.bytes_skipped)})"
        )
    out = [f"pushed {result.ref}", f"digest: {result.digest}", line]
    for digest in result.referrers:
        out.append(f"sbom: pushed as an OCI 1.1 referrer of {result.digest}: {digest}")
    if any(b.media_type == engines.ZSTD_MEDIA_TYPE for b in result.blobs):
        out.append(engines.compression_note("zstd") or "")
    else:
        out.append(f"layers are gzip: read by {engines.readers('gzip')}")
    return out


def register(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Push the image in the OCI layout DIR to REGISTRY/REPO:TAG. Blobs the "
        "registry already has are not uploaded again; the digest the registry reports is "
        "checked against the layout's. Credentials come from the Docker config "
        "($DOCKER_CONFIG, ~/.docker/config.json) or the containers auth file "
        "($REGISTRY_AUTH_FILE)."
    )
    p.add_argument(
        "layout",
        metavar="DIR",
        type=Path,
        help="an OCI image layout folder, or the output folder of `envbuild build` (as for load)",
    )
    p.add_argument("target", metavar="REGISTRY/REPO:TAG")
    p.add_argument(
        "--layout-tag", metavar="NAME", help="which image of DIR (when it holds more than one)"
    )
    add_registry_args(p)
    render.add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    target = parse_ref(args.target, what="push target")
    result = push(
        args.layout,
        target,
        tag=args.layout_tag,
        endpoint=endpoint_from_args(args),
        transport=get_transport(args.transport, docker_engine()),
    )
    if args.json:
        render.emit_json(result.as_dict())
    else:
        for line in describe_push(result):
            render.echo(line)
    return ExitCode.OK
