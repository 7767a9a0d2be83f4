"""Every command of the CLI, as light data: its name, the line ``envbuild --help`` lists, and the
module under ``envbuild.cli`` that defines its arguments and runs it.

The top-level parser is made from this table alone, so ``envbuild --help`` (and a usage error)
imports no command module and no stage of the core. Only the command that argv names has its
module imported (:func:`envbuild.cli.main.build_parser`): that module's ``register(p)`` is given the
command's own parser, already named and summarised here, and sets its description, its arguments
and ``func``. What every command's parser shares (options, epilog, formatter) is added in one
place, :func:`command_parser`.
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Command:
    name: str
    #: the one line ``envbuild --help`` lists for it
    summary: str
    #: ``envbuild.cli.<module>``: its arguments (``register``) and the code that runs it
    module: str = ""
    #: what exit status 1 means for it; "" for a command that never returns 1
    differs: str = ""

    @property
    def module_name(self) -> str:
        return f"envbuild.cli.{self.module or self.name}"


#: Commands, in the order ``envbuild --help`` lists them.
COMMANDS: tuple[Command, ...] = (
    Command(
        "validate",
        "check specs: types, unknown keys, and whether the GPU stack fits together",
    ),
    Command("show", "print the fully merged spec (extends resolved, defaults filled in)"),
    Command(
        "lock",
        "resolve a spec's Python packages into lockfiles/pylock.<name>.toml",
        differs="--check: a lock is not current (stale)",
    ),
    Command("push", "push an OCI image layout to a registry (blobs it has are not sent again)"),
    Command("pull", "pull an image into a new OCI layout, verifying every blob"),
    Command(
        "ci",
        "check every lock, build every image, push, write a markdown summary",
        differs="a lock is not current (that spec is not built)",
    ),
    Command(
        "snapshot",
        "record what this machine is: driver, GPUs, Python environments, services, models",
    ),
    Command(
        "diff",
        "compare two snapshots (or a snapshot and a build manifest); three or more: one table of "
        "what differs between the machines",
        differs="they differ (of three or more: at least two machines differ)",
    ),
    Command(
        "verify",
        "check this machine against a snapshot manifest (exit 1 on drift)",
        differs="the machine drifted from the snapshot (--fleet: at least two snapshots differ)",
    ),
    Command("adopt", "turn a hand-built environment into a spec, a lock and declared patches"),
    Command("build", "build the OCI image of a spec from its lock (no Docker daemon)"),
    Command("dockerfile", "render a Dockerfile equivalent to `envbuild build` (for docker users)"),
    Command("load", "load a built image into a Docker engine"),
    Command("gc", "remove store blobs and derivations that no image or root refers to"),
    Command(
        "store",
        "source builds and patched wheels: plan, add a wheel built elsewhere, list, locate",
        differs="store verify: a blob or derivation record is wrong",
    ),
    Command(
        "apply",
        "build the spec's environment as a new generation, fetch the model, switch the vLLM "
        "unit to it",
    ),
    Command(
        "generations",
        "list the generations apply built (spec, date, which is current); --gc removes old",
        differs="--verify: a generation's files do not match",
    ),
    Command("rollback", "switch back to the previous generation (or --to N) and restart its unit"),
    Command(
        "render",
        "render files for people to use: host-setup (driver + CUDA toolkit script), unit (the "
        "vLLM systemd unit apply would install)",
        module="render_host",
    ),
    Command("completion", "print a shell completion script (bash, zsh, fish)"),
)

BY_NAME: dict[str, Command] = {c.name: c for c in COMMANDS}


def exit_codes_help(differs: str | None = None) -> str:
    """The ``exit codes:`` epilog: every code (``differs`` None, the top-level help), or one
    command's (exit 1 only when ``differs`` says what it means for that command)."""
    one = "a difference was found (stale lock, drift, snapshots differ)"
    lines = ["exit codes:", "  0  success"]
    if differs is None or differs:
        lines.append(f"  1  {differs or one}")
    lines += [
        "  2  bad input or usage (the message names the file, key and fix)",
        "  3  the environment failed (missing tool, network, engine, disk)",
        "  4  internal error (rerun with -v and report it)",
        "  128+N  stopped by signal N (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP), its children with it",
    ]
    return "\n".join(lines) + "\n"


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, with the ``exit codes:`` epilog kept as its lines are (descriptions wrap)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("exit codes:"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def add_output_options(p: argparse.ArgumentParser, *, top: bool = False) -> None:
    """``-v`` and ``-q``, which every parser takes: before the command (``top``: with their
    defaults) or after it (a command's: set only when given, so they never undo the top's)."""
    unset = argparse.SUPPRESS
    p.add_argument(
        "-v", "--verbose", action="count", default=0 if top else unset,
        help="more output; -v shows tracebacks",
    )  # fmt: skip
    p.add_argument(
        "-q", "--quiet", action="store_true", default=False if top else unset,
        help="only errors and warnings on stderr: no progress, no summary",
    )  # fmt: skip


def command_parser(sub: Any, command: Command) -> argparse.ArgumentParser:
    """The parser of ``command`` as a choice of ``sub`` (the top-level subparsers action), bare:
    the command's module fills it in when argv names it. Every command takes ``-v``/``-q`` and
    its ``--help`` ends with the exit codes it may return."""
    p: argparse.ArgumentParser = sub.add_parser(
        command.name,
        help=command.summary,
        epilog=exit_codes_help(command.differs),
        formatter_class=HelpFormatter,
    )
    add_output_options(p)
    return p


def register(p: argparse.ArgumentParser, command: Command) -> None:
    """Import ``command``'s module and let it define its arguments on ``p``."""
    importlib.import_module(command.module_name).register(p)
