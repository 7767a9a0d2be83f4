"""`envbuild load DIR`: load a built image into a Docker engine (the docker SDK)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from envbuild.build.dockerarchive import DOCKER_ARCHIVE
from envbuild.build.load import load_into_engine
from envbuild.cli import render
from envbuild.cli.engineopts import docker_engine
from envbuild.errors import ExitCode


def register(p: argparse.ArgumentParser) -> None:
    p.description = (
        f"Load the image in DIR (the output folder of `envbuild build`, holding "
        f"{DOCKER_ARCHIVE}, or that tar itself) into the Docker engine named by $DOCKER_HOST "
        "(or --host, or the default socket), and print the loaded image's id and tags."
    )
    p.add_argument("path", metavar="DIR", type=Path)
    p.add_argument("--host", metavar="URL", help="the engine (default: $DOCKER_HOST)")
    render.add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    loaded = load_into_engine(args.path, docker_engine(args.host))
    if args.json:
        render.emit_json(loaded.as_dict())
    else:
        for tag in loaded.tags:
            render.echo(f"loaded {tag}")
        render.echo(loaded.image_id)
    if note := loaded.engine_note():
        print(f"note: {note}", file=sys.stderr)
    return ExitCode.OK
