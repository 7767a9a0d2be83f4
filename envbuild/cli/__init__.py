"""The command line: parse, call the core, render the result, map errors to exit codes.

Each command lives in its own module under ``envbuild.cli`` (listed in
:mod:`envbuild.cli.commands`) and exposes ``register(parser)``, which fills in its parser and sets
``func`` to a function ``(args) -> int``; a module is imported only when argv names its command.
Commands never catch envbuild errors themselves: :func:`main` decides how every kind of error looks.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Sequence

from envbuild import __version__
from envbuild.cli import commands, render
from envbuild.errors import EnvbuildError, ExitCode, SpecError

#: Command names, in the order ``--help`` lists them (the table: :mod:`envbuild.cli.commands`).
COMMANDS: tuple[str, ...] = tuple(c.name for c in commands.COMMANDS)

EXIT_CODES_HELP = commands.exit_codes_help()
#: Commands whose progress lines (on stderr) --json leaves out, as a script running them wants.
QUIET_UNDER_JSON = frozenset({"snapshot", "verify", "push", "pull"})


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or (``only``) of that one command in full and the others as
    bare names. A command's module imports the core it drives, so only the one argv names is
    imported: ``envbuild --help`` lists the commands from :mod:`envbuild.cli.commands` alone,
    and a snapshot does not pay for importing the build, lock and apply stages first."""
    parser = argparse.ArgumentParser(
        prog="envbuild",
        description="Declarative, reproducible environments and OCI images for GPU serving.",
        epilog=EXIT_CODES_HELP,
        formatter_class=commands.HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"envbuild {__version__}")
    commands.add_output_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in commands.COMMANDS:
        p = commands.command_parser(sub, command)
        if command.name == only:  # the others are never parsed further: argv names this one
            commands.register(p, command)
    return parser


def _command_in(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: its first word that is one (global options take no value,
    so nothing before the command can be mistaken for it). None: help, or a usage error."""
    for arg in argv:
        if arg == "--":
            return None
        if not arg.startswith("-"):
            return arg if arg in commands.BY_NAME else None
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
    # these under --json: stderr carries warnings and errors only (-v: progress too)
    quiet = args.quiet or (as_json and command in QUIET_UNDER_JSON and not args.verbose)
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
