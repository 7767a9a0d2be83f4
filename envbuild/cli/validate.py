"""`envbuild validate SPEC...`: check specs, report every problem at once."""

from __future__ import annotations

import argparse
from typing import Any

from envbuild.cli import render
from envbuild.errors import ExitCode, InputFileError, Problem, SpecError, UserError
from envbuild.spec.validate import validate


def register(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Validate each SPEC. Every problem is reported with its file, line, key and "
        "a fix; errors make the exit code 2, warnings alone do not."
    )
    p.add_argument("specs", nargs="+", metavar="SPEC", help="spec files (TOML)")
    render.add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    results: list[dict[str, Any]] = []
    failed = False
    for path in args.specs:
        problems: list[Problem]
        try:
            report = validate(path)
            problems = report.warnings
            ok = True
            name = report.loaded.name
        except SpecError as exc:
            problems, ok, name = exc.problems, False, None
            if not args.json and len(args.specs) == 1:
                raise
        except UserError as exc:  # missing, unreadable, not a file: this spec, not the others
            if not args.json and len(args.specs) == 1:
                raise
            where = exc.path if isinstance(exc, InputFileError) else path
            message = exc.message.removeprefix(f"{where}: ")
            problems, ok, name = [Problem(where, None, "", message, exc.hint)], False, None
        failed |= not ok
        results.append(
            {"spec": path, "name": name, "ok": ok, "problems": [p.as_dict() for p in problems]}
        )
        if not args.json:
            for problem in problems:
                render.echo(problem.render())
            if ok:
                n = len(problems)
                note = f" ({n} warning{'' if n == 1 else 's'})" if n else ""
                render.echo(f"{path}: ok{note}")
    if args.json:
        render.emit_json({"results": results})
    return ExitCode.USER_ERROR if failed else ExitCode.OK
