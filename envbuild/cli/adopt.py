"""`envbuild adopt --python PATH`: a hand-built environment becomes a spec, a lock and patches."""

from __future__ import annotations

import argparse
from pathlib import Path

from envbuild.cli import render
from envbuild.errors import ExitCode


def register(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Pin every distribution of the environment at its installed version (checked "
        "against the published wheel's RECORD), turn every hand edit into a patch against "
        "the published file, and read the host's GPUs and the serving unit into a spec. "
        "Writes specs/NAME.toml, lockfiles/pylock.NAME.toml and patches/NAME/*.patch; "
        "names what it could not adopt (rebuild needed, unrecorded files)."
    )
    p.add_argument("--python", required=True, metavar="PATH", help="the interpreter or venv")
    p.add_argument("--unit", metavar="NAME", help="the vLLM unit serving it (or its unit file)")
    p.add_argument("--name", metavar="NAME", help="the spec's name (default: the venv's folder)")
    p.add_argument(
        "--index", metavar="URL", default=None, help="the simple index (default: PyPI's)"
    )
    p.add_argument("--repo", metavar="DIR", default=".", help="the repository (default: .)")
    p.add_argument("--hf-cache", metavar="DIR", help="Hugging Face cache (default: the hub's)")
    p.add_argument("--force", action="store_true", help="replace an existing spec of that name")
    render.add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from envbuild.adopt import Options, adopt
    from envbuild.adopt.index import PYPI
    from envbuild.spec.load import find_root

    repo = find_root(Path(args.repo).absolute() / "x")
    result = adopt(
        Options(
            python=args.python,
            repo=repo,
            name=args.name,
            unit=args.unit,
            index_url=args.index or PYPI,
            force=args.force,
            hf_cache=args.hf_cache,
        )
    )
    if args.json:
        render.emit_json(result.as_dict())
    else:
        for line in result.lines():
            render.echo(line)
    return ExitCode.OK
