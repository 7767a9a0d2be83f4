"""`envbuild rollback [N]`: switch back to an earlier generation and its unit."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path

from envbuild.apply import host as hostmod
from envbuild.apply.manage import rollback
from envbuild.cli import render
from envbuild.cli.apply import _interrupt, add_root_flags, show_recovery
from envbuild.errors import ExitCode, UsageError


def register(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Point `current` back at an earlier generation, install its unit, stop the "
        "current one and start it, waiting for its health endpoint. A failure puts everything "
        "back. A switch cut short by a kill is undone first; if it was an apply, that is the "
        "rollback. Services that are not envbuild's and that the current generation's apply "
        "stopped to free GPU memory are started again with --yes."
    )
    add_root_flags(p)
    p.add_argument("n", type=int, nargs="?", metavar="N", help="the generation to switch to")
    p.add_argument("--to", type=int, metavar="N", help="the same as N")
    p.add_argument(
        "--yes",
        action="store_true",
        help="also start again the other services the rolled-back apply stopped",
    )
    p.add_argument("--health-timeout", type=float, default=1800.0, metavar="SECONDS")
    render.add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.n is not None and args.to is not None and args.n != args.to:
        raise UsageError(f"rollback to {args.n} or to {args.to}? give N once")
    to = args.n if args.n is not None else args.to
    host = hostmod.real_host(Path(args.root))
    old = signal.signal(signal.SIGTERM, _interrupt)
    try:
        outcome = rollback(
            host, to=to, agreed=args.yes, wait=args.wait, health_timeout=args.health_timeout
        )
    finally:
        signal.signal(signal.SIGTERM, old)
    if args.json:
        render.emit_json(outcome.as_dict())
        return ExitCode.OK
    if outcome.recovered is not None:
        show_recovery(outcome.recovered)
    result = outcome.switch
    if result is not None:
        render.echo(f"current: generation {result.current} (was {result.previous})")
        if result.stopped:
            render.echo(f"stopped: {', '.join(result.stopped)}")
        if result.unit and result.started:
            render.echo(f"{result.unit}: started, healthy after {result.healthy_after_s:.1f} s")
    if outcome.others_started:
        render.echo(f"started again: {', '.join(outcome.others_started)}")
    if outcome.others_stopped:
        names = " ".join(outcome.others_stopped)
        render.echo(
            f"still stopped: {', '.join(outcome.others_stopped)} (the rolled-back apply stopped "
            f"them to free GPU memory); start them with `systemctl start {names}`"
        )
    return ExitCode.OK
