"""Every command of the CLI, as light data: its name, the line ``envbuild --help`` lists, and the
module under ``envbuild.cli`` that defines its arguments and runs it.

The top-level parser is made from this table alone, so ``envbuild --help`` (and a usage error)
imports no command module and no stage of the core. Only the command that argv names has its
module imported (:func:`envbuild.cli.build_parser`): that module's ``register(p)`` is given the
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
    Command("lock", "resolve a spec's Python packages into lockfiles/pylock.<name>.toml"),
    Command("push", "push an OCI image layout to a registry (blobs it has are not sent again)"),
    Command("pull", "pull an image into a new OCI layout, verifying every blob"),
    Command("ci", "check every lock, build every image, push, write a markdown summary"),
    Command(
        "snapshot",
        "record what this machine is: driver, GPUs, Python environments, services, models",
    ),
    Command("diff", "compare two snapshots (or a snapshot and a build manifest)"),
    Command("verify", "check this machine against a snapshot manifest (exit 1 on drift)"),
    Command("build", "build the OCI image of a spec from its lock (no Docker daemon)"),
    Command("dockerfile", "render a Dockerfile equivalent to `envbuild build` (for docker users)"),
    Command("load", "load a built image into a Docker engine"),
    Command("gc", "remove store blobs and derivations that no image or root refers to"),
    Command(
        "store",
        "source builds and patched wheels: plan, add a wheel built elsewhere, list, locate",
    ),
    Command(
        "apply",
        "build the spec's environment as a new generation, fetch the model, switch the vLLM "
        "unit to it",
    ),
    Command(
        "generations",
        "list the generations apply built (spec, date, which is current); --gc removes old",
    ),
    Command("rollback", "switch back to the previous generation (or --to N) and restart its unit"),
    Command(
        "render",
        "render files for people to use: host-setup (driver + CUDA toolkit script), unit (the "
        "vLLM systemd unit apply would install)",
        module="render_host",
    ),
)

BY_NAME: dict[str, Command] = {c.name: c for c in COMMANDS}


def command_parser(sub: Any, command: Command) -> argparse.ArgumentParser:
    """The parser of ``command`` as a choice of ``sub`` (the top-level subparsers action), bare:
    the command's module fills it in when argv names it."""
    p: argparse.ArgumentParser = sub.add_parser(command.name, help=command.summary)
    return p


def register(p: argparse.ArgumentParser, command: Command) -> None:
    """Import ``command``'s module and let it define its arguments on ``p``."""
    importlib.import_module(command.module_name).register(p)
