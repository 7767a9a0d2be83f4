"""The command line: parse, call the core, render the result, map errors to exit codes.

Each command lives in its own module under ``envbuild.cli`` and exposes ``register(subparsers)``,
which adds its parser and sets ``func`` to a function ``(args) -> int``. Commands never catch
envbuild errors themselves: :func:`main` decides how every kind of error looks.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import traceback
from collections.abc import Sequence

from envbuild import __version__
from envbuild.cli import render
from envbuild.errors import EnvbuildError, ExitCode, SpecError

#: Command modules, in the order ``--help`` lists them.
COMMANDS: tuple[str, ...] = (
    "validate",
    "show",
    "lock",
    "push",
    "pull",
    "ci",
    "snapshot",
    "diff",
    "verify",
    "build",
    "dockerfile",
    "load",
    "gc",
    "store",
    "apply",
    "generations",
    "rollback",
    "render-host",
)

EXIT_CODES_HELP = """\
exit codes:
  0  success
  1  a difference was found (stale lock, drift, snapshots differ)
  2  bad input or usage (the message names the file, key and fix)
  3  the environment failed (missing tool, network, engine, disk)
  4  internal error (rerun with -v and report it)
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="envbuild",
        description="Declarative, reproducible environments and OCI images for GPU serving.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"envbuild {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more output; -v shows tracebacks"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="only errors on stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"envbuild.cli.{name.replace('-', '_')}")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error (argparse printed it)
        return int(exc.code or 0) if not isinstance(exc.code, str) else ExitCode.USER_ERROR
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return ExitCode.USER_ERROR
    handler = render.setup_logging(args.verbose, args.quiet)
    as_json = bool(getattr(args, "json", False))
    render.reset_json()
    try:
        return int(args.func(args))
    except EnvbuildError as exc:
        if isinstance(exc, SpecError):
            render.problem_lines(exc.lines())
        else:
            render.error_lines(exc.lines())
        if args.verbose:
            traceback.print_exc(file=sys.stderr)
        if as_json:
            render.emit_json_error(exc, exc.exit_code)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        render.error_lines(["interrupted"])
        if as_json:
            render.emit_json_error(exc, ExitCode.INTERRUPTED)
        return ExitCode.INTERRUPTED
    except Exception as exc:
        if args.verbose:
            traceback.print_exc(file=sys.stderr)
        render.error_lines(
            [
                f"internal error: {type(exc).__name__}: {exc}",
                "hint: rerun with -v to see the traceback, and report it",
            ]
        )
        if as_json:
            render.emit_json_error(exc, ExitCode.INTERNAL)
        return ExitCode.INTERNAL
    finally:
        logging.getLogger("envbuild").removeHandler(handler)
