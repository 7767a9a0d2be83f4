"""`envbuild apply SPEC|SNAPSHOT`: make this machine run the spec (or recreate a snapshot)."""

from __future__ import annotations

import argparse
from pathlib import Path

from envbuild.apply import host as hostmod
from envbuild.apply.checks import PreflightReport, Status
from envbuild.apply.core import ApplyOutcome, Options, apply
from envbuild.apply.imagesource import find_image, open_image, spec_of
from envbuild.apply.inputs import load_input
from envbuild.apply.manage import recover_pending
from envbuild.apply.paths import HF_HOME
from envbuild.apply.switch import Recovery
from envbuild.apply.wheels import StoreWheels
from envbuild.cli import render
from envbuild.cli.cacheopts import add_cache_args, store_with_cache
from envbuild.cli.engineopts import docker_engine
from envbuild.cli.registryopts import add_registry_args, endpoint_from_args
from envbuild.errors import ExitCode, UsageError
from envbuild.registry.core import get_transport
from envbuild.registry.ref import parse_ref, parse_repo
from envbuild.store.remote import CachedStore, CacheStats


def add_root_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--root",
        default="/",
        metavar="DIR",
        help="work under DIR instead of / (state, units, secrets, HF cache); for trying and tests",
    )
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait this long for another envbuild apply/rollback/gc to finish (default: refuse)",
    )


def register(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Check the machine (all at once), build an immutable generation from the "
        "lock, fetch the model at its pinned revision, install the vLLM unit, stop the old "
        "experiment's unit, start the new one and wait until it is healthy. Any failure puts "
        "the previous generation and unit back; a switch cut short by a kill is undone by the "
        "next apply, rollback or generations (or --recover). A SNAPSHOT (.json) is recreated "
        "from the spec and lock it names."
    )
    p.add_argument("source", metavar="SPEC|SNAPSHOT", nargs="?")
    p.add_argument(
        "--recover",
        action="store_true",
        help="only undo a switch that was cut short (a killed apply or rollback), if any",
    )
    add_root_flags(p)
    p.add_argument(
        "--hf-home",
        default=HF_HOME,
        metavar="PATH",
        help=f"HF_HOME for the model and the unit, under --root (default: {HF_HOME})",
    )
    p.add_argument("--yes", action="store_true", help="agree to stop running units")
    p.add_argument("--dry-run", action="store_true", help="run preflight only; change nothing")
    p.add_argument(
        "--repair",
        action="store_true",
        help="a generation of this spec whose shared files were edited is put right from the "
        "wheels (and so is every generation linking the same install trees), then reused",
    )
    p.add_argument(
        "--health-timeout",
        type=float,
        default=1800.0,
        metavar="SECONDS",
        help="how long to wait for vLLM's /health (default: 1800)",
    )
    g = p.add_argument_group("the venv from an image (the registry as a substituter)")
    g.add_argument(
        "--image",
        metavar="REGISTRY/REPO@sha256:…",
        help="take the venv from this image (built from SPEC and its lock: its labels say so), "
        "file for file: only the layers the store lacks are fetched, nothing is installed. "
        "Without SPEC: specs/<the image's spec>.toml of the current folder",
    )
    g.add_argument(
        "--from",
        dest="from_repo",
        metavar="REGISTRY/REPO",
        help="as --image, with the image of SPEC's lock found in REGISTRY/REPO by its labels",
    )
    add_cache_args(p)  # source builds and patched wheels: pulled if built elsewhere, else pushed
    add_registry_args(p)
    render.add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.recover:
        if args.source is not None:
            raise UsageError("--recover takes no SPEC: it only undoes a switch cut short")
        return _recover(args)
    if args.image and args.from_repo:
        raise UsageError("give --image or --from, not both")
    if args.source is None and not args.image:
        raise UsageError("give the SPEC or SNAPSHOT to apply (or --recover)")
    host = hostmod.real_host(Path(args.root), args.hf_home)
    image = None
    if args.image:
        ref = parse_ref(args.image, what="--image")
        image = open_image(ref, endpoint_from_args(args), host.store)
    if args.source is None:
        assert image is not None
        args.source = spec_of(image)
    if args.cache and isinstance(host.wheels, StoreWheels):
        cached = store_with_cache(
            host.wheels.store,
            args,
            endpoint_from_args(args),
            get_transport(args.transport, docker_engine()),
        )
        host.wheels = StoreWheels(cached)
    inp = load_input(Path(args.source), host.paths)
    if args.from_repo:
        repo = parse_repo(args.from_repo, what="--from")
        image = find_image(repo, inp, endpoint_from_args(args), host.store)
    options = Options(
        image=image,
        agreed=args.yes,
        dry_run=args.dry_run,
        wait=args.wait,
        health_timeout=args.health_timeout,
        repair=args.repair,
    )
    show = None if args.json else _show_preflight
    show_recovered = None if args.json else show_recovery
    # SIGTERM undoes a half-done switch like Ctrl-C does: both raise a KeyboardInterrupt
    # (envbuild.errors.Interrupted, from the CLI's envbuild.proc.core.stopping_on_signals)
    outcome = apply(inp, host, options, on_preflight=show, on_recovered=show_recovered)
    stats = _cache_stats(host)
    if args.json:
        render.emit_json({**outcome.as_dict(), "cache": stats.as_dict() if stats else None})
    else:
        _show_result(outcome, args.dry_run)
        if stats is not None:
            render.echo(
                f"cache {args.cache}: {len(stats.hits)} build(s) pulled, "
                f"{len(stats.published)} published"
            )
    return outcome.exit_code


def _cache_stats(host: hostmod.HostAccess) -> CacheStats | None:
    wheels = host.wheels
    if isinstance(wheels, StoreWheels) and isinstance(wheels.store, CachedStore):
        return wheels.store.remote.stats
    return None


def _recover(args: argparse.Namespace) -> int:
    host = hostmod.real_host(Path(args.root), args.hf_home)
    recovered = recover_pending(host, wait=args.wait)
    if args.json:
        render.emit_json({"recovered": recovered.as_dict() if recovered else None})
    elif recovered is None:
        render.echo("nothing to recover: no switch was cut short")
    else:
        show_recovery(recovered)
    return ExitCode.OK


def show_recovery(r: Recovery) -> None:
    render.echo(r.summary())
    for action in r.actions:
        render.echo(f"  {action}")


_MARK = {Status.OK: "ok", Status.WARN: "warn", Status.FAIL: "FAIL", Status.SKIP: "skip"}


def _show_preflight(report: PreflightReport) -> None:
    render.echo("preflight:")
    for check in report.checks:
        render.echo(f"  {_MARK[check.status]:<4}  {check.name:<11} {check.message}")
        if check.hint and check.status is Status.FAIL:
            render.echo(f"        {'':<11} fix: {check.hint}")
    if not report.ok:
        kind = (
            "the spec does not fit this machine"
            if report.exit_code == ExitCode.USER_ERROR
            else "the machine is not ready"
        )
        render.echo(f"preflight failed: {kind}; nothing was changed")


def _show_result(o: ApplyOutcome, dry_run: bool) -> None:
    if not o.preflight.ok:
        return
    if dry_run:
        render.echo("dry run: preflight passed; nothing was changed")
        return
    for rejected in o.rejected:
        render.echo(
            f"generation {rejected['number']} was modified after it was built, not reused: "
            + "; ".join(rejected["problems"][:3])
        )
    for line in o.repaired:
        render.echo(f"repaired: {line}")
    if o.image is not None:
        i = o.image
        render.echo(
            f"image {i['image']}: {i['blobs_fetched']} blob(s) fetched "
            f"({i['bytes_fetched']} bytes), {i['trees_made']} layer tree(s) made, "
            f"{i['trees_reused']} already in the store"
        )
    how = "reused" if o.reused else "built"
    render.echo(f"generation {o.generation} ({how}): {o.generation_path}")
    for what, m in ([("model", o.model)] if o.model else []) + [("repo", r) for r in o.repos]:
        where = "fetched and verified" if m.fetched else "already in the cache"
        render.echo(
            f"{what} {m.repo}@{m.revision[:12]}: {m.files} files, {m.size_bytes / 1e9:.2f} GB, "
            f"{where}"
        )
    if o.up_to_date:
        render.echo(
            "already current and running: nothing switched"
            if o.serves
            else "already current (the spec has no unit): nothing switched"
        )
    elif o.switch is not None:
        s = o.switch
        if s.stopped:
            render.echo(f"stopped: {', '.join(s.stopped)}")
        if s.others_stopped:
            render.echo(
                f"left stopped: {', '.join(s.others_stopped)} (not envbuild's units; they held "
                "GPU memory). `envbuild rollback --yes` starts them again"
            )
        if s.unit and s.started:
            render.echo(
                f"{s.unit}: started, healthy after {s.healthy_after_s or 0:.1f} s ({s.health_url})"
            )
        elif s.unit:
            render.echo(f"{s.unit}: installed at {s.unit_file}, not started")
        before = f" (was {s.previous})" if s.previous is not None else ""
        render.echo(f"current: generation {s.current}{before}")
    if o.snapshot:
        render.echo(f"snapshot: {o.snapshot}")
