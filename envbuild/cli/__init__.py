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

#: Commands, in the order ``--help`` lists them; each is ``envbuild.cli.<name>``.
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
    "adopt",
    "build",
    "dockerfile",
    "load",
    "gc",
    "store",
    "apply",
    "generations",
    "rollback",
    "render",
)
#: Commands whose module has another name.
_MODULES = {"render": "render_host"}

_COMMAND_NAMES = frozenset(COMMANDS)

EXIT_CODES_HELP = """\
exit codes:
  0  success
  1  a difference was found (stale lock, drift, snapshots differ)
  2  bad input or usage (the message names the file, key and fix)
  3  the environment failed (missing tool, network, engine, disk)
  4  internal error (rerun with -v and report it)
"""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or (``only``) of that one command in full and the others as
    bare names: a command module imports the core it drives, and a snapshot should not pay for
    importing the build, lock and apply stages first (half a second of start-up)."""
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
        if only is not None and name != only:
            sub.add_parser(name)  # never parsed further: argv names another command
            continue
        module = importlib.import_module(f"envbuild.cli.{_MODULES.get(name, name)}")
        module.register(sub)
    return parser


def _command_in(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: its first word that is one (global options take no value,
    so nothing before the command can be mistaken for it). None: help, or a usage error."""
    for arg in argv:
        if arg == "--":
            return None
        if not arg.startswith("-"):
            return arg if arg in _COMMAND_NAMES else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    command = _command_in(args_in)
    if "--version" in args_in and set(args_in) <= {"--version", "-v", "-q"}:
        print(f"envbuild {__version__}")  # what argparse's version action prints, sooner
        return ExitCode.OK
    parser = build_parser(command)
    try:
        args = parser.parse_args(args_in)
    except SystemExit as exc:  # --help, --version, or a usage error (argparse printed it)
        return int(exc.code or 0) if not isinstance(exc.code, str) else ExitCode.USER_ERROR
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return ExitCode.USER_ERROR
    as_json = bool(getattr(args, "json", False))
    # snapshot and verify under --json: stderr carries warnings and errors only (-v: progress)
    quiet = args.quiet or (as_json and command in ("snapshot", "verify") and not args.verbose)
    handler = render.setup_logging(args.verbose, quiet)
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
