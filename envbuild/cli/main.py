"""The command line: parse, call the core, render the result, map errors to exit codes.

Each command lives in its own module under ``envbuild.cli`` (listed in
:mod:`envbuild.cli.commands`) and exposes ``register(parser)``, which fills in its parser and sets
``func`` to a function ``(args) -> int``; a module is imported only when argv names its command.
Commands never catch envbuild errors themselves: :func:`main` decides how every kind of error looks.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from envbuild import __version__
from envbuild.cli import commands, render
from envbuild.errors import EnvbuildError, EnvironmentFailure, ExitCode, Interrupted, SpecError

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


def _full_disk(exc: OSError) -> EnvbuildError | None:
    """A full disk (or quota) wherever it struck is the environment's failure (exit 3), named
    with its folder and room, not an internal error."""
    from envbuild import fsio

    if exc.errno not in fsio.NO_SPACE:
        return None
    if not exc.filename:
        return EnvironmentFailure("no space left on device", hint="free disk space")
    path = Path(os.fsdecode(exc.filename))
    return fsio.no_space(path.parent, doing=f"writing {path.name}")


def _escape_undecodable_output() -> None:
    """A file name that is not UTF-8 (kept as surrogates, as the OS gave it) prints as ``\\udcXX``
    instead of ending the command with a UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    _escape_undecodable_output()
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
    from envbuild.proc import (
        core as proc,  # here: `envbuild --version` and a usage error need no subprocess
    )

    try:
        with proc.stopping_on_signals():  # SIGTERM/SIGINT/SIGHUP stop the children, then envbuild
            try:
                return int(args.func(args))
            except OSError as exc:
                full = _full_disk(exc)
                if full is None:
                    raise
                raise full from exc
    except EnvbuildError as exc:
        if isinstance(exc, SpecError) or isinstance(getattr(exc, "cause", None), SpecError):
            render.problem_lines(exc.lines())
        else:
            render.error_lines(exc.lines())
        if args.verbose:
            traceback.print_exc(file=sys.stderr)
        if as_json:
            render.emit_json_error(exc, exc.exit_code)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        signalled = exc if isinstance(exc, Interrupted) else None
        code = signalled.exit_code if signalled else ExitCode.INTERRUPTED
        render.error_lines([f"interrupted ({signalled.name})" if signalled else "interrupted"])
        if as_json:
            render.emit_json_error(exc, code)
        return code
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
