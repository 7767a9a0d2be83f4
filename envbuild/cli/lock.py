"""`envbuild lock SPEC... [--check]`: resolve specs into lockfiles, or check they are current."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from envbuild.cli import render
from envbuild.errors import ExitCode, UsageError
from envbuild.lock import check_lock, lock_spec
from envbuild.spec.validate import validate


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "lock",
        help="resolve a spec's Python packages into lockfiles/<name>.pylock.toml",
        description="Resolve each SPEC with uv for its target (Python version, platform tag, "
        "torch index, exclude-newer cutoff) and write lockfiles/<spec-name>.pylock.toml "
        "(PEP 751). With --check, resolve nothing: exit 1 and say what changed when a lock "
        "no longer matches its spec, 0 when it does.",
    )
    p.add_argument("specs", nargs="+", metavar="SPEC", help="spec files (TOML)")
    p.add_argument(
        "--check",
        action="store_true",
        help="only check that each lock matches its spec (exit 1 if not)",
    )
    p.add_argument(
        "--output",
        "-o",
        type=Path,
        metavar="PATH",
        help="write (or check) the lock at PATH instead of lockfiles/ (one SPEC only)",
    )
    render.add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.output is not None and len(args.specs) > 1:
        raise UsageError("--output takes one SPEC, got several")
    if args.check:
        return _check(args)
    results = []
    for spec in args.specs:
        loaded = validate(spec).loaded
        result = lock_spec(loaded, output=args.output)
        shown = loaded.display(result.path)
        results.append(result.as_dict(shown))
        if not args.json:
            state = "written" if result.changed else "unchanged"
            render.echo(f"{shown}: {len(result.lock.packages)} packages ({state})")
    if args.json:
        render.emit_json({"results": results})
    return ExitCode.OK


def _check(args: argparse.Namespace) -> int:
    results = []
    stale = False
    for spec in args.specs:
        loaded = validate(spec).loaded
        check = check_lock(loaded, path=args.output)
        stale |= not check.ok
        results.append(check.as_dict())
        if not args.json:
            if check.ok:
                render.echo(f"{check.lock}: current")
            else:
                render.echo(f"{check.lock}: stale")
                for change in check.changes:
                    render.echo(f"  {change.message}")
    if args.json:
        render.emit_json({"results": results})
    return ExitCode.DIFFERENT if stale else ExitCode.OK
