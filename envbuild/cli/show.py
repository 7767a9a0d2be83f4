"""`envbuild show SPEC`: the fully merged spec, with defaults filled in."""

from __future__ import annotations

import argparse

from envbuild.cli import render
from envbuild.errors import ExitCode
from envbuild.spec import load_spec


def register(p: argparse.ArgumentParser) -> None:
    p.description = "Print SPEC after its extends are merged and defaults are filled in."
    p.add_argument("spec", metavar="SPEC")
    render.add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    loaded = load_spec(args.spec)
    data = loaded.spec.model_dump(mode="json")
    if args.json:
        render.emit_json(
            {
                "spec": data,
                "files": [loaded.display(f) for f in loaded.files],
                "spec_hash": loaded.spec_hash(),
            }
        )
    else:
        render.echo(
            f"# {loaded.display(loaded.path)} (merged from "
            f"{', '.join(loaded.display(f) for f in loaded.files)})"
        )
        render.echo(f"# spec hash: {loaded.spec_hash()}")
        # Python mode keeps TOML's own types (a date-time stays one), so the output is a spec.
        render.echo(render.to_toml(loaded.spec.model_dump(mode="python")).rstrip())
    return ExitCode.OK
