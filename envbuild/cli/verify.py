"""`envbuild verify MANIFEST`: check this machine against a snapshot; print only the drift.
`envbuild verify --fleet SNAPSHOT…`: the snapshots of several machines against each other."""

from __future__ import annotations

import argparse
from pathlib import Path

from envbuild.cli import render
from envbuild.cli.diff import run_fleet
from envbuild.cli.engineopts import docker_engine
from envbuild.errors import ExitCode, UsageError
from envbuild.snapshot.diff.facts import size_text
from envbuild.snapshot.diff.render import render_text
from envbuild.snapshot.verify import GpuMemory, verify


def register(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Take a snapshot of what MANIFEST recorded (its Python environments, services and "
        "model cache, or the --python given) and print only what drifted. Exit 1 on drift. "
        "With --fleet, compare snapshots taken on several machines instead (gathered by your "
        "own means: ssh, Ansible): one table of only what differs between them, exit 1 when "
        "anything does."
    )
    p.add_argument("manifest", metavar="MANIFEST", nargs="?")
    p.add_argument(
        "--fleet",
        nargs="+",
        metavar="SNAPSHOT",
        help="compare these snapshots (two or more) with each other instead of this machine",
    )
    p.add_argument(
        "--python",
        action="append",
        default=[],
        metavar="PATH",
        help="check this environment instead of the manifest's (repeatable)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="check sizes, and hash only files newer than their install, and no model blobs "
        "(seconds)",
    )
    render.add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.fleet is not None:
        if args.manifest is not None or args.python or args.quick:
            raise UsageError(
                "verify --fleet compares snapshots with each other: give no MANIFEST, --python "
                "or --quick with it",
                hint="envbuild verify --fleet "
                + " ".join(filter(None, [args.manifest, *args.fleet])),
            )
        if len(args.fleet) < 2:
            raise UsageError("verify --fleet needs two snapshots or more")
        return run_fleet(args.fleet, json=args.json)
    if args.manifest is None:
        raise UsageError("verify needs a MANIFEST (or --fleet SNAPSHOT…)")
    result = verify(
        Path(args.manifest),
        pythons=args.python,
        integrity="quick" if args.quick else "full",
        engine=docker_engine(),  # the engine the snapshot asked: one setting for both
    )
    if args.json:
        render.emit_json(result.as_dict())
        return ExitCode.DIFFERENT if result.drift else ExitCode.OK
    if result.drift:
        for line in render_text(result.diff, only_counted=True):
            if not line.startswith("not compared:"):
                render.echo(line)
    else:
        render.echo(f"no drift from {args.manifest}")
        for info in result.diff.info:  # what differs by design (a patch that makes it so)
            render.echo(f"info: {info}")
    for line in held_lines(result.gpu_memory):
        render.echo(line)
    for warning in result.warnings:
        render.echo(f"warning: {warning}")
    return ExitCode.DIFFERENT if result.drift else ExitCode.OK


def held_lines(held: list[GpuMemory]) -> list[str]:
    """Who holds GPU memory now: shown whether or not anything drifted (it is state)."""
    if not held:
        return []
    lines = ["GPU memory in use now (state: shown, not counted):"]
    for m in held:
        reserved = (
            f" (+{size_text(m.reserved_bytes)} reserved by the driver)" if m.reserved_bytes else ""
        )
        procs = ", ".join(
            f"pid {p['pid']} {p['name'] or '?'} ({p['unit'] or 'no unit'}) "
            + (size_text(p["used_memory_bytes"]) if p["used_memory_bytes"] is not None else "?")
            for p in m.processes
        )
        lines.append(
            f"  gpu{m.gpu}: {size_text(m.used_bytes)} of {size_text(m.total_bytes)} used{reserved}"
            + (f" by {procs}" if procs else " (by no process NVML can name)")
        )
    return lines
