"""`envbuild render host-setup SPEC`: the script that installs a spec's driver and toolkit."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from envbuild.apply.hostsetup import render_host_setup
from envbuild.cli import render
from envbuild.errors import ExitCode
from envbuild.fsio import write_atomic
from envbuild.spec import load_spec


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "render",
        help="render files for people to use: host-setup (driver + CUDA toolkit script)",
        description="Render a file from a spec. envbuild never runs what it renders here.",
    )
    what = p.add_subparsers(dest="what", metavar="WHAT", required=True)
    hs: argparse.ArgumentParser = what.add_parser(
        "host-setup",
        help="a shell script installing the spec's NVIDIA driver and CUDA toolkit (apt)",
        description="Write a POSIX shell script that installs the driver version and CUDA "
        "toolkit the spec pins from NVIDIA's apt repository (Debian/Ubuntu), idempotently.",
    )
    hs.add_argument("spec", metavar="SPEC")
    hs.add_argument("-o", "--output", metavar="FILE", help="write here (mode 0755), not stdout")
    hs.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    text = render_host_setup(load_spec(args.spec))
    if args.output:
        write_atomic(Path(args.output), text, 0o755)
    else:
        render.echo(text.rstrip("\n"))
    return ExitCode.OK
