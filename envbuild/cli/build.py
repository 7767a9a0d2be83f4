"""`envbuild build [SPEC]`: the image of a spec and its lock, layered and reproducible."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from envbuild.cli import render
from envbuild.cli.cacheopts import add_cache_args, store_with_cache
from envbuild.cli.registryopts import add_registry_args, endpoint_from_args
from envbuild.errors import ExitCode
from envbuild.oci.layout import COMPRESSION, Compression
from envbuild.progress import NULL, Progress, Task, reporting

if TYPE_CHECKING:
    from envbuild.build.plan import Plan
    from envbuild.pipeline.core import ImageBuild

DEFAULT_SPEC = "specs/quickstart.toml"

log = logging.getLogger(__name__)


def add_builder_args(p: argparse.ArgumentParser) -> None:
    """``--no-docker-archive``, ``--builder`` and ``--builder-network`` (build and ci)."""
    p.add_argument(
        "--no-docker-archive",
        dest="docker_archive",
        action="store_false",
        help="skip docker-archive.tar (with zstd layers it holds them uncompressed for Docker "
        "< 23: gigabytes rewritten whenever the image changes)",
    )
    p.add_argument(
        "--builder",
        choices=["host", "container"],
        default="host",
        help="where source builds ([builds]) run: in a build venv on this machine (default), or "
        "in a container made from the image's own lower layers on the Docker engine at "
        "$DOCKER_HOST (default: the default socket)",
    )
    p.add_argument(
        "--builder-network",
        metavar="NAME",
        default="host",
        help="the network of a builder container (default: %(default)s; it gets this machine's "
        "proxy variables and $SSL_CERT_FILE, for the build only)",
    )


def register(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Build SPEC's image from its lock: a base, the venv, one layer per big "
        "distribution, grouped small ones, vLLM on top. Unchanged layers come from the store. "
        "Writes images/<spec>/ (OCI layout, docker-load archive, build-manifest.json) and "
        "prints the image digest last."
    )
    p.add_argument(
        "spec", metavar="SPEC", nargs="?", default=DEFAULT_SPEC, help=f"default: {DEFAULT_SPEC}"
    )
    p.add_argument(
        "--store",
        metavar="DIR",
        type=Path,
        help="the store (default: $ENVBUILD_STORE or ~/.cache/envbuild/store)",
    )
    p.add_argument("--output", metavar="DIR", type=Path, help="default: images/<spec-name>/")
    p.add_argument("--dry-run", action="store_true", help="print the layer plan and build nothing")
    add_compression_arg(p)
    add_builder_args(p)
    add_cache_args(p)
    add_registry_args(p)
    render.add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    if not args.dry_run and not args.cache:  # a cache is pushed to by every build, no-ops too
        from envbuild.build import noop
        from envbuild.store.blobs import default_root

        request = noop.Request.of(
            args.spec,
            args.output,
            compression=args.compression,
            docker_archive=args.docker_archive,
            builder=args.builder,
            builder_network=args.builder_network,
        )
        store_root = Path(args.store).absolute() if args.store else default_root().absolute()
        if (done := noop.check(store_root, request)) is not None:
            return _up_to_date(args, done, time.perf_counter() - start)
    # the build's stages are imported here: a no-op rebuild that can tell it is one from a stat
    # of the output folder and its inputs (envbuild.build.noop) needs none of them
    from envbuild.cli.engineopts import docker_engine
    from envbuild.pipeline.core import BuilderOptions, build
    from envbuild.registry import compat as engines
    from envbuild.registry.core import get_transport
    from envbuild.spec import load_spec
    from envbuild.store.core import Store, default_store
    from envbuild.store.remote import CachedStore

    loaded = load_spec(args.spec)
    store = Store(args.store) if args.store else default_store()
    if args.cache and not args.dry_run:
        transport = get_transport(args.transport, docker_engine())
        store = store_with_cache(store, args, endpoint_from_args(args), transport)
    progress = RichProgress() if _interactive(args) else NULL
    with progress_context(progress):
        result = build(
            loaded,
            store=store,
            output=args.output,
            dry_run=args.dry_run,
            compression=Compression(args.compression),
            docker_archive=args.docker_archive,
            builder=BuilderOptions(
                mode=args.builder, network=args.builder_network, engine=docker_engine()
            ),
        )
    if args.json:  # the plan of a dry run, the build manifest of a build: the same data as text
        data = result.plan if result.manifest is None else result.manifest
        render.emit_json(data.model_dump(mode="json"))
        return ExitCode.OK
    if args.dry_run:
        keys = [layer.key for layer in result.plan.layers]
        cached = {key for key in keys if store.lookup(key) is not None}
        for line in plan_lines(result.plan, cached):
            render.echo(line)
        return ExitCode.OK
    for line in build_lines(result):
        render.note(line)
    if note := engines.compression_note(args.compression):
        render.note(note)
    if isinstance(store, CachedStore):
        stats = store.remote.stats
        render.note(
            f"cache {args.cache}: {len(stats.hits)} derivation(s) pulled "
            f"({_mb(stats.bytes_fetched)}), {len(stats.published)} published "
            f"({_mb(stats.bytes_uploaded)} uploaded)"
        )
    assert result.manifest is not None
    render.echo(result.manifest.image)
    return ExitCode.OK


def add_compression_arg(p: argparse.ArgumentParser) -> None:
    """``--compression``, for build and ci: the rule (which engines read which) in its help."""
    p.add_argument(
        "--compression",
        choices=[c.value for c in (Compression.ZSTD, Compression.GZIP)],
        default=COMPRESSION.value,
        help=render.LaterHelp(_compression_help),
    )


def _compression_help() -> str:
    from envbuild.registry import compat as engines

    return (
        f"layer compression (default: %(default)s). zstd is read by {engines.readers('zstd')}; "
        "gzip by every tool (Debian 12's skopeo 1.9 and umoci 0.4.7, and upstream Docker 20.10, "
        "need it). Part of every layer's key"
    )


def _interactive(args: argparse.Namespace) -> bool:
    return (
        not args.json
        and not getattr(args, "quiet", False)
        and sys.stderr.isatty()
        and sys.stdout.isatty()
    )


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def plan_lines(plan: Plan, cached: Collection[str] = ()) -> list[str]:
    """The plan for people (what ``--dry-run`` prints); ``cached``: the layer keys the store
    already holds."""
    lines = [
        f"plan for {plan.spec} (format {plan.format})",
        f"  spec hash  {plan.spec_hash}",
        f"  lock hash  {plan.lock_hash}",
        f"  target     python {plan.target['python_version']} {plan.target['platform']}, "
        f"venv {plan.target['venv']} -> {plan.target['interpreter']}",
        f"  installer  {plan.installer}; pack {plan.pack['compressor']}; "
        f"SOURCE_DATE_EPOCH={plan.source_date_epoch}",
        f"  layers     {plan.base.layers + len(plan.layers)} of at most {plan.options.max_layers}",
        f"  base       {plan.base.description}",
    ]
    lines += [f"  {src.kind:<6} {src.dist}: {src.summary}" for src in plan.sources]
    for layer in plan.layers:
        state = "cached" if layer.key in cached else "to build"
        if layer.provisional:
            state = "after its wheel"
        names = ", ".join(f"{d.name}=={d.version}" for d in layer.dists)
        extra = "".join(f" [{d} loses to {w}]" for d, w in layer.loses_to.items())
        lines.append(
            f"  {layer.kind:<6} {layer.name:<28} {_mb(layer.wheel_bytes):>11}  {layer.key[:12]}  "
            f"{state:<8} {names}{extra}"
        )
    lines.append(f"  cmd        {' '.join(plan.config.cmd)}")
    lines += [f"  env        {key}={value}" for key, value in sorted(plan.config.env.items())]
    return lines


def build_lines(result: ImageBuild) -> list[str]:
    """What a build did, for people (on stderr; stdout gets the image digest): each source
    build and patch, each layer rebuilt or cached, and the wall time."""
    assert result.manifest is not None and result.output is not None
    m = result.manifest
    return summary_lines(
        m.spec,
        [layer.model_dump(mode="json") for layer in m.layers],
        result.sources,
        rebuilt=result.rebuilt,
        output=result.output,
        wall=result.wall,
        setid=m.base.get("setid") or {},
    )


def summary_lines(
    spec: str,
    layers: list[dict[str, Any]],
    sources: Sequence[Any],
    *,
    rebuilt: Collection[str],
    output: Path,
    wall: float,
    setid: Mapping[str, str],
) -> list[str]:
    """:func:`build_lines` from the manifest's layers (as JSON) and the source outcomes (each
    with ``kind``, ``dist``, ``version``, ``key``, ``reused``, ``changes``, ``previous``)."""
    lines = []
    for src in sources:
        state = "reused" if src.reused else "built"
        lines.append(f"{src.kind} {src.dist} {src.version}  {src.key[:12]}  {state}")
        if src.changes:
            since = f" since {src.previous[:12]}" if src.previous else ""
            lines.append(f"  inputs changed{since}: {'; '.join(src.changes)}")
    for layer in layers:
        state = "rebuilt" if layer["name"] in rebuilt else "cached"
        if layer["kind"] == "base":
            state = "base"
        lines.append(
            f"{layer['name']:<28} {_mb(layer['size']):>11}  {layer['digest'][:19]}  {state}"
        )
    if setid:  # kept (a base needs them), never silently
        lines.append(
            f"base keeps {len(setid)} setuid/setgid file(s): "
            + ", ".join(f"{path} {mode}" for path, mode in setid.items())
        )
    # the stages overlap (the base beside the layers): their sum is not the wall time
    lines.append(
        f"built {spec}: {len(layers)} layers ({len(rebuilt)} rebuilt) in {wall:.1f} s -> {output}"
    )
    return lines


def _up_to_date(args: argparse.Namespace, done: Any, wall: float) -> int:
    """Say what a no-op build says, from the folder's manifest: nothing was rebuilt."""
    manifest = json.loads(done.manifest)
    if args.json:
        render.emit_json(manifest)
        return ExitCode.OK
    sources = [SimpleNamespace(**s, reused=True, changes=[], previous=None) for s in done.sources]
    for line in summary_lines(
        manifest["spec"],
        manifest["layers"],
        sources,
        rebuilt=(),
        output=done.output,
        setid=manifest.get("base", {}).get("setid") or {},
        wall=wall,
    ):
        render.note(line)
    from envbuild.registry import compat as engines

    if note := engines.compression_note(args.compression):
        render.note(note)
    render.echo(done.image)
    return ExitCode.OK


# --- progress on a terminal -------------------------------------------------------------------


class _RichTask(Task):
    def __init__(self, owner: RichProgress, description: str, total: int | None, unit: str) -> None:
        super().__init__(description, total, unit=unit)
        self._owner = owner
        self._id = owner.bars.add_task(description, total=total, unit=unit)

    def _update(self) -> None:
        self._owner.bars.update(self._id, completed=self.completed)

    def done(self) -> None:
        self._owner.bars.remove_task(self._id)


class RichProgress(Progress):
    """Bars with bytes/s for downloads and packing, on stderr."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            TextColumn,
            TimeElapsedColumn,
            TransferSpeedColumn,
        )
        from rich.progress import (
            Progress as Bars,
        )
        from rich.text import Text

        class Bytes(DownloadColumn):
            def render(self, task: Any) -> Text:
                return super().render(task) if task.fields.get("unit") == "B" else Text("")

        class Speed(TransferSpeedColumn):
            def render(self, task: Any) -> Text:
                return super().render(task) if task.fields.get("unit") == "B" else Text("")

        self.bars = Bars(
            TextColumn("{task.description}"),
            BarColumn(),
            Bytes(),
            Speed(),
            TimeElapsedColumn(),
            console=Console(file=sys.stderr),
            transient=True,
        )
        self._lock = threading.Lock()

    def task(self, description: str, total: int | None = None, *, unit: str = "B") -> Task:
        with self._lock:
            return _RichTask(self, description, total, unit)


class progress_context:
    def __init__(self, progress: Progress) -> None:
        self.progress = progress

    def __enter__(self) -> Progress:
        if isinstance(self.progress, RichProgress):
            self.progress.bars.start()
        self._reporting = reporting(self.progress)
        return self._reporting.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._reporting.__exit__(None, None, None)
        if isinstance(self.progress, RichProgress):
            self.progress.bars.stop()
