"""`envbuild diff A B [C …]`: what differs between two snapshots, or a snapshot and a build
manifest; given three or more, one table of what differs between the machines (as
`verify --fleet`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from envbuild.cli import render
from envbuild.errors import ExitCode
from envbuild.snapshot.diff.compare import diff_files
from envbuild.snapshot.diff.fleet import fleet_files
from envbuild.snapshot.diff.render import render_fleet, render_text


def register(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Compare A and B, grouped like `nix store diff-closures`: package versions with size "
        "deltas, driver/CUDA/GPU, files modified since install, services, models, layers. "
        "Given three or more snapshots (a fleet), print one table of only the rows where at "
        "least two machines differ, each value with the machines that have it. "
        "Exit 0 when equal, 1 when different."
    )
    p.add_argument("a", metavar="A")
    p.add_argument("b", metavar="B")
    p.add_argument("more", metavar="C", nargs="*", help="more snapshots: compare them as a fleet")
    render.add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.more:
        return run_fleet([args.a, args.b, *args.more], json=args.json)
    result = diff_files(Path(args.a), Path(args.b))
    if args.json:
        render.emit_json(result.as_dict())
    else:
        for line in render_text(result):
            render.echo(line)
        if not result.different:
            render.echo(f"no differences between {args.a} and {args.b}")
    return ExitCode.DIFFERENT if result.different else ExitCode.OK


def run_fleet(paths: list[str], *, json: bool) -> int:
    """The fleet table of ``paths`` (text or JSON); exit 1 when any row is in it."""
    result = fleet_files([Path(p) for p in paths])
    if json:
        render.emit_json(result.as_dict())
    else:
        for line in render_fleet(result):
            render.echo(line)
        if not result.different:
            render.echo(
                f"no difference across {len(paths)} machines (volatile state such as free disk "
                "and GPU memory in use is not compared)"
            )
    return ExitCode.DIFFERENT if result.different else ExitCode.OK
