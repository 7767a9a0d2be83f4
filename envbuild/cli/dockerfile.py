"""`envbuild dockerfile SPEC`: an equivalent Dockerfile, rendered from the spec and its lock."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from envbuild.build import load_lock
from envbuild.cli import render
from envbuild.dockerfile import render_dockerfile
from envbuild.errors import ExitCode
from envbuild.fsio import write_atomic
from envbuild.lock import lock_path
from envbuild.spec import load_spec


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "dockerfile",
        help="render a Dockerfile equivalent to `envbuild build` (for docker users)",
        description="Render SPEC's image as a Dockerfile: FROM the base, apt packages, the "
        "lock's wheels installed with uv and checked hashes, the same env, command and labels.",
    )
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("-o", "--output", metavar="FILE", type=Path, help="write here, not stdout")
    render.add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    loaded = load_spec(args.spec)
    lock, lock_hash = load_lock(loaded)
    result = render_dockerfile(
        loaded, lock, lock_hash=lock_hash, lock_file=loaded.display(lock_path(loaded))
    )
    if args.output:
        write_atomic(args.output, result.text)
    if args.json:
        render.emit_json(
            {"base": result.base, "requirements": result.requirements, "dockerfile": result.text}
        )
    elif not args.output:
        render.echo(result.text.rstrip("\n"))
    return ExitCode.OK
