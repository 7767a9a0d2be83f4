"""`envbuild snapshot`: what this machine really is, as a versioned JSON manifest."""

from __future__ import annotations

import argparse
from pathlib import Path

from envbuild.cli import render
from envbuild.cli.engineopts import docker_engine
from envbuild.errors import ExitCode
from envbuild.fsio import canonical_json, write_atomic
from envbuild.snapshot.core import Options, take_snapshot
from envbuild.snapshot.model.core import Snapshot
from envbuild.snapshot.systemd import DEFAULT_PATTERN


def register(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Record host, GPUs (NVML), the Python environments named with --python (every file "
        "checked against its RECORD), CUDA toolkits, Docker containers, systemd units and the "
        "Hugging Face cache as a JSON manifest. Secrets are never recorded. Without -o the "
        "manifest goes to stdout."
    )
    p.add_argument(
        "--python",
        action="append",
        default=[],
        metavar="PATH",
        help="a Python interpreter or venv to inspect (repeatable)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="check sizes, and hash only files newer than their install, and no model blobs "
        "(seconds)",
    )
    p.add_argument("--spec", metavar="SPEC", help="record the spec (and lock) this was built from")
    p.add_argument("--image", metavar="DIR", help="record an image folder's build manifest")
    p.add_argument("--hf-cache", metavar="DIR", help="Hugging Face cache (default: the hub's)")
    p.add_argument("--no-models", action="store_true", help="skip the Hugging Face cache")
    p.add_argument(
        "--services",
        default=DEFAULT_PATTERN,
        metavar="PATTERN",
        help=f"systemd units to record (default: {DEFAULT_PATTERN})",
    )
    p.add_argument("--no-docker", action="store_true", help="skip Docker")
    p.add_argument("--no-systemd", action="store_true", help="skip systemd")
    p.add_argument("-o", "--output", metavar="FILE", help="write the manifest here")
    render.add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    snap = take_snapshot(
        Options(
            pythons=args.python,
            integrity="quick" if args.quick else "full",
            spec=args.spec,
            image=args.image,
            hf_cache=args.hf_cache,
            models=not args.no_models,
            services=args.services,
            docker=not args.no_docker,
            engine=docker_engine(),
            systemd=not args.no_systemd,
        )
    )
    text = canonical_json(snap.model_dump(mode="json"))
    if args.output is None or args.json:
        if args.output:
            write_atomic(Path(args.output), text)
        render.echo(text.rstrip("\n"))
        return ExitCode.OK
    write_atomic(Path(args.output), text)
    for line in summary(snap):
        render.echo(line)
    render.echo(f"wrote {args.output}")
    return ExitCode.OK


def summary(snap: Snapshot) -> list[str]:
    h, g = snap.host, snap.gpu
    lines = [f"host: {h.os.pretty_name or h.os.id}, kernel {h.kernel}, {h.logical_cpus} CPUs"]
    if g.available:
        lines.append(
            f"driver {g.driver_version}, CUDA {g.cuda_driver_version}, {len(g.gpus)} GPU(s)"
        )
        for d in g.gpus:
            used = d.memory_used_bytes / 2**30
            procs = ", ".join(
                f"{p.pid} {p.name or '?'} ({p.unit or 'no unit'})" for p in d.processes
            )
            lines.append(
                f"  gpu{d.index}: {d.name}, cc {d.compute_capability}, "
                f"{d.memory_total_bytes / 2**30:.1f} GiB, {used:.1f} GiB used"
                + (f" by {procs}" if procs else "")
            )
    else:
        lines.append(f"GPUs: not available ({g.reason})")
    for env in snap.pythons:
        mod = sum(len(d.modified) for d in env.distributions)
        gone = sum(len(d.missing) for d in env.distributions)
        added = sum(len(d.unrecorded) for d in env.distributions) + len(env.unowned)
        no_record = sum(d.record_sha256 is None for d in env.distributions)
        lines.append(
            f"python {env.requested}: {env.implementation} {env.version}, "
            f"{len(env.distributions)} distributions, {mod} modified, {gone} missing, "
            f"{added} unrecorded, {len(env.overlaps)} overlapping paths"
            + (f", {no_record} without RECORD" if no_record else "")
            + f" ({env.integrity} check)"
        )
        for dist in env.distributions:
            who = f"({dist.name} {dist.version})"
            if dist.record_sha256 is None:
                lines.append(f"  no RECORD: {dist.dist_info} {who}: its files cannot be checked")
            lines.extend(
                f"  modified: {m.path} {who}"
                + ("" if m.written_after_record is not False else " (older than its RECORD: "
                   "the RECORD may be wrong as shipped)")
                for m in dist.modified
            )  # fmt: skip
            lines.extend(f"  missing: {path} {who}" for path in dist.missing)
            lines.extend(f"  unrecorded: {path} {who}" for path in dist.unrecorded)
        owners = {a.path: a.folder_owners for a in env.added or []}
        for path in env.unowned:
            shared = owners.get(path)
            where = f"a folder of {' & '.join(shared)}" if shared else "no distribution"
            lines.append(f"  unrecorded: {path} ({where})")
        for f in [f for f in env.links or [] if f.loaded]:
            what = ", ".join(f.demangled or f.missing[:5])
            who = f.distribution or "no distribution"
            lines.append(f"  will not load: {f.file} ({who}) needs {what} ({f.cause})")
    if snap.redacted:
        lines.append(f"redacted: {', '.join(snap.redacted)}")
    return lines
