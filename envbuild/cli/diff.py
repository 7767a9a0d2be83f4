"""`envbuild diff A B`: what differs between two snapshots, or a snapshot and a build manifest."""

from __future__ import annotations

import argparse
from pathlib import Path

from envbuild.cli import render
from envbuild.errors import ExitCode
from envbuild.snapshot.diff.compare import diff_files
from envbuild.snapshot.diff.render import render_text


def register(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Compare A and B, grouped like `nix store diff-closures`: package versions with size "
        "deltas, driver/CUDA/GPU, files modified since install, services, models, layers. "
        "Exit 0 when equal, 1 when different."
    )
    p.add_argument("a", metavar="A")
    p.add_argument("b", metavar="B")
    render.add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    result = diff_files(Path(args.a), Path(args.b))
    if args.json:
        render.emit_json(result.as_dict())
    else:
        for line in render_text(result):
            render.echo(line)
        if not result.different:
            render.echo(f"no differences between {args.a} and {args.b}")
    return ExitCode.DIFFERENT if result.different else ExitCode.OK
