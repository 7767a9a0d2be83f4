"""`envbuild build`: spec + lock -> a layered, bit-for-bit reproducible OCI image, no daemon.

A chain of explicit stages, each one's errors wrapped with its name (apko's habit), each in a
module of its own; this module runs them in order:

    plan    -> the layer plan from the spec and the lock alone (:mod:`.planner`; what
               ``--dry-run`` prints)
    fetch   -> every locked wheel into the store, size and sha256 checked (:mod:`.fetch`);
               overlaps checked (:mod:`.overlaps`)
    base    -> the base's layers (Debian rootfs, registry image, OCI layout or rootfs tarball;
               :mod:`.basestage`), in a thread beside fetch and the lower layers
    layers  -> per planned layer: install its distributions with uv into a fresh staging root
               and pack it (deterministic tar, zstd; :mod:`.layerbuild`) — skipped when the
               store has its key
    sources -> the source builds and patches (:mod:`envbuild.sourcebuild`), then the layers
               installing them
    links   -> the image's link check (:mod:`.links`)
    image   -> config, manifest, OCI layout, SBOM and a ``docker load`` archive under the
               output dir (:mod:`.outputs`, :mod:`.sbom`)
    root    -> the store keeps what the image needs alive through ``gc``

Every layer is a store derivation keyed by the plan's key, so an unchanged layer is neither
installed nor packed again, and a no-op rebuild only re-reads the store's records.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from envbuild.build import image, layers, noop
from envbuild.build.basestage import base_stage
from envbuild.build.fetch import fetch_wheels
from envbuild.build.layerbuild import build_layers
from envbuild.build.links import link_check
from envbuild.build.manifest import BaseResult, BuildManifest, BuiltLayer, stored_layer
from envbuild.build.outputs import Sbom, lock_output, output_files, write_outputs
from envbuild.build.overlaps import overlap_report
from envbuild.build.plan import Plan, PlanLayer, resolve_layer
from envbuild.build.sbom import image_sbom
from envbuild.engine import ContainerEngine, DockerEngine
from envbuild.errors import EnvbuildError, StageError
from envbuild.installed.venv import VenvTarget
from envbuild.lock.base import spec_path
from envbuild.lock.core import find_lock
from envbuild.lock.model import Lock
from envbuild.lock.wheels import WheelRef
from envbuild.pipeline.planner import (
    COMPRESSION,
    compression_of,
    load_lock,
    make_plan,
    plan_target,
    wheel_refs,
)
from envbuild.progress import NULL, Progress
from envbuild.sourcebuild.builder import Builder, HostBuilder
from envbuild.sourcebuild.sources import SourceOutcome, realize_sources
from envbuild.spec import LoadedSpec
from envbuild.store.core import Store, output_root_name

log = logging.getLogger(__name__)


@contextlib.contextmanager
def stage(name: str, timings: dict[str, float] | None = None) -> Iterator[None]:
    """Run a stage: envbuild's own errors get the stage's name in front; others too, as an
    environment failure, so one clear line reaches the user."""
    start = time.perf_counter()
    try:
        yield
    except EnvbuildError as exc:
        if not exc.message.startswith(f"{name}: "):
            exc.message = f"{name}: {exc.message}"
            exc.args = (exc.message, *exc.args[1:])
        raise
    except OSError as exc:
        raise StageError(f"{name}: {exc.strerror or exc} ({exc.filename or ''})") from exc
    finally:
        if timings is not None:
            timings[name] = timings.get(name, 0.0) + time.perf_counter() - start


@dataclass(frozen=True)
class BuilderOptions:
    """Where source builds run: ``host`` (a build venv here) or ``container`` (a builder
    container made from the image's own lower layers, on ``engine`` (default: the Docker engine
    at the default socket), attached to ``network``)."""

    mode: Literal["host", "container"] = "host"
    network: str = "host"
    engine: ContainerEngine | None = None


@dataclass
class ImageBuild:
    """What one ``envbuild build`` did: the plan (its provisional layers resolved once the
    sources stage ran), the build manifest and output folder (None for a dry run), the source
    builds and patches, which layers were made now and which came from the store."""

    manifest: BuildManifest | None
    plan: Plan
    output: Path | None
    #: seconds per stage; the base runs beside fetch and the lower layers, so they overlap
    timings: dict[str, float] = field(default_factory=dict)
    wall: float = 0.0  # seconds the whole build took
    rebuilt: list[str] = field(default_factory=list)  # names of layers installed and packed now
    reused: list[str] = field(default_factory=list)
    sources: list[SourceOutcome] = field(default_factory=list)  # source builds and patches


# --- the build --------------------------------------------------------------------------------


def build(
    loaded: LoadedSpec,
    *,
    store: Store,
    output: Path | None = None,
    dry_run: bool = False,
    compression: layers.Compression = COMPRESSION,
    docker_archive: bool = True,
    progress: Progress = NULL,
    builder: BuilderOptions | None = None,
) -> ImageBuild:
    """Build ``loaded``'s image into ``output`` (default ``<repo>/images/<spec-name>``).

    The layers whose key the plan knows (base, venv, big distributions, groups, an unpatched
    vLLM) are built first; then the sources stage realizes the source builds and patches (a
    builder container needs those lower layers) and the layers installing them get their keys.
    """
    start = time.perf_counter()
    timings: dict[str, float] = {}
    options = builder or BuilderOptions()
    request = noop.Request.of(
        loaded.path,
        output,
        compression=compression.value,
        docker_archive=docker_archive,
        builder=options.mode,
        builder_network=options.network,
    )
    # taken before the build reads anything: what changes while it runs is not recorded as built
    fingerprint, inputs = (None, None) if dry_run else (noop.fingerprint(), _inputs(loaded))
    with stage("plan", timings):
        lock, lock_hash = load_lock(loaded)
        plan = make_plan(loaded, lock, lock_hash=lock_hash, compression=compression)
    out = output if output is not None else loaded.root / "images" / loaded.name
    if dry_run:
        return ImageBuild(None, plan, None, timings)
    result = ImageBuild(None, plan, out, timings)
    with store.session():
        low = _lower(loaded, lock, plan, store, progress, result)
        built, blobs = low.built, low.blobs
        with stage("sources", timings):
            made = realize_sources(
                loaded,
                lock,
                store,
                lambda: _builder(builder or BuilderOptions(), loaded, plan, store, low),
                locked={w.canonical: w for w in low.wheels},
                progress=progress,
            )
            plan = plan.with_layers(
                [
                    resolve_layer(
                        layer,
                        made.wheels[layer.name].wheel,
                        made.wheels[layer.name].sources,
                    )
                    if layer.provisional
                    else layer
                    for layer in plan.layers
                ]
            )
            result.plan, result.sources = plan, made.outcomes
            blobs.update({r.wheel.sha256: r.path for r in made.wheels.values()})
        with stage("layers", timings):
            top = [layer for layer in plan.layers if layer.name not in built]
            _layers(top, store, low, progress, result)
        with stage("links", timings):
            low.kept.append(
                link_check(
                    loaded,
                    plan,
                    store,
                    base=low.base,
                    target=low.target,
                    leaves=low.leaves,
                    by_sha=low.by_sha,
                    blobs=blobs,
                    progress=progress,
                )
            )
        made_wheels = {r.wheel.sha256: r.path for r in made.wheels.values()}
        sbom_keys: list[str] = []

        def sbom_of(built_manifest: BuildManifest) -> Sbom:
            made_sbom, key = image_sbom(
                plan,
                lock,
                built_manifest,
                store,
                by_sha=low.by_sha,
                made=made_wheels,
                progress=progress,
            )
            sbom_keys.append(key)
            return made_sbom

        # two builds into one folder take turns, each writing the folder and then its root
        with lock_output(out):
            noop.forget(store.root, request)  # written again below once the folder is whole
            with stage("image", timings):
                manifest = write_outputs(
                    plan,
                    store,
                    low.base,
                    built,
                    low.overlaps,
                    out,
                    docker_archive=docker_archive,
                    source_builds=made.builds,
                    patches=made.patches,
                    created=image.created_for(lock.envbuild.exclude_newer),
                    sbom=sbom_of,
                )
            with stage("root", timings):
                # one root per output folder, as Nix has one per out-link: it keeps what the
                # folder's image needs until the folder is removed or holds another image
                store.set_root(
                    output_root_name(out),
                    blobs=[manifest.image, manifest.config, *(b.digest for b in manifest.layers)],
                    # the overlap report, a Debian resolution, the source builds and patched
                    # wheels, the SBOM too: gc must not make the next build redo them
                    derivations=[
                        *(layer.key for layer in plan.layers),
                        *low.kept,
                        *made.keys,
                        *sbom_keys,
                    ],
                    output=out,
                    image=manifest.image,
                    files=(files := output_files(out, manifest)),
                )
                if fingerprint is not None and inputs and lock_hash in inputs.values():
                    noop.write_record(
                        store.root,
                        request,
                        fingerprint=fingerprint,
                        inputs=inputs,
                        output=out,
                        image=manifest.image,
                        files=files,
                        sources=[
                            {"kind": o.kind, "dist": o.dist, "version": o.version, "key": o.key}
                            for o in made.outcomes
                        ],
                    )
    result.manifest = manifest
    result.wall = time.perf_counter() - start
    # the stages overlap (the base is made beside the layers), so they do not add up to the wall
    # time; `envbuild -v build` shows them (--json is the build manifest: the same bytes each time)
    log.debug(
        "stages: %s; wall %.2f s",
        ", ".join(f"{name} {seconds:.2f} s" for name, seconds in timings.items()),
        result.wall,
    )
    return result


def _inputs(loaded: LoadedSpec) -> dict[str, str] | None:
    """The sha256 of every file ``loaded``'s image is made from (:mod:`.noop`): the spec and
    what it extends, its patches, its lock, a base layout's index; None when one is missing
    (the build fails on it, and records nothing)."""
    files = [*loaded.files, *(p for ps in loaded.patch_files().values() for p in ps)]
    files.append(find_lock(loaded))
    base = loaded.spec.base
    if base.kind == "oci-layout":
        files.append(spec_path(loaded, ("base", "path"), base.path) / "index.json")
    try:
        return noop.inputs_of(files)
    except OSError:
        return None


def source_builder(
    loaded: LoadedSpec,
    store: Store,
    options: BuilderOptions,
    *,
    compression: layers.Compression = COMPRESSION,
    progress: Progress = NULL,
) -> Builder:
    """The builder ``envbuild build`` runs ``loaded``'s source builds in (what ``envbuild store
    add-wheel`` keys a wheel for): a builder container needs the image's lower layers, which are
    built here, or found in the store."""
    if options.mode == "host":
        return HostBuilder(loaded.spec.python.version)
    lock, lock_hash = load_lock(loaded)
    plan = make_plan(loaded, lock, lock_hash=lock_hash, compression=compression)
    with store.session():
        low = _lower(loaded, lock, plan, store, progress, ImageBuild(None, plan, None))
        return _builder(options, loaded, plan, store, low)


@dataclass
class _Lower:
    """What the stages below the sources stage made."""

    wheels: list[WheelRef]
    by_sha: dict[str, WheelRef]
    blobs: dict[str, Path]
    overlaps: list[dict[str, Any]]
    leaves: dict[str, frozenset[str]]
    target: VenvTarget
    compression: layers.Compression
    base: BaseResult = field(init=False)  # set once the base's thread is done
    built: dict[str, BuiltLayer] = field(default_factory=dict)
    kept: list[str] = field(default_factory=list)


def _lower(
    loaded: LoadedSpec,
    lock: Lock,
    plan: Plan,
    store: Store,
    progress: Progress,
    result: ImageBuild,
) -> _Lower:
    """fetch, base and the layers whose key the plan knows (everything but the provisional).

    The base is made in a thread of its own while the wheels are fetched and the Python layers
    installed and packed: neither needs the other (a layer holds the venv's files, not the
    base's), and mmdebstrap spends most of its time in one process (dpkg and maintainer
    scripts), so on two cores the layers take the other."""
    timings = result.timings
    kept: list[str] = []
    target, comp = plan_target(plan), compression_of(plan)
    lower = [layer for layer in plan.layers if not layer.provisional]
    wheels = wheel_refs(lock, plan)

    def make_base() -> BaseResult:
        with stage("base", timings):
            return base_stage(loaded, lock, store, comp, progress, kept)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="envbuild-base") as side:
        base = side.submit(make_base)
        with stage("fetch", timings):
            todo = [layer for layer in lower if not store.available(layer.key)]
            needed = {d.sha256 for layer in todo for d in layer.dists}
            blobs = fetch_wheels(
                [w for w in wheels if w.sha256 in needed], store, progress=progress
            )
            overlaps, leaves = overlap_report(loaded, wheels, store, target, progress, kept)
        low = _Lower(
            wheels=wheels,
            by_sha={w.sha256: w for w in wheels},
            blobs=blobs,
            overlaps=overlaps,
            leaves=leaves,
            target=target,
            compression=comp,
            kept=kept,
        )
        with stage("layers", timings):
            _layers(lower, store, low, progress, result, defer_to=base)
        low.base = base.result()
    return low


def _layers(
    todo: list[PlanLayer],
    store: Store,
    low: _Lower,
    progress: Progress,
    result: ImageBuild,
    defer_to: Future[Any] | None = None,
) -> None:
    """Install and pack ``todo`` (:func:`~envbuild.build.layerbuild.build_layers`) and record
    them in ``low`` and ``result``; nothing when ``defer_to`` (the base) failed: that is the
    caller's to raise."""
    got = build_layers(
        todo,
        store,
        blobs=low.blobs,
        by_sha=low.by_sha,
        leaves=low.leaves,
        target=low.target,
        compression=low.compression,
        progress=progress,
        defer_to=defer_to,
    )
    if got is None:
        return
    for layer, (built, reused) in zip(todo, got, strict=True):
        low.built[layer.name] = built
        (result.reused if reused else result.rebuilt).append(layer.name)


def _builder(
    options: BuilderOptions, loaded: LoadedSpec, plan: Plan, store: Store, low: _Lower
) -> Builder:
    """The builder source builds run in; a builder container's image is the base and every
    layer built so far (venv, torch and the rest), with the image's env."""
    if options.mode == "host":
        return HostBuilder(loaded.spec.python.version)
    from envbuild.sourcebuild.container import ContainerBuilder

    lower = [low.built[layer.name] for layer in plan.layers if layer.name in low.built]
    config = image.OciImageConfig(env=plan.config.env, cmd=["/bin/sh"]).merged_over(low.base.config)
    return ContainerBuilder(
        store,
        layers=[*low.base.layers, *(stored_layer(store, b) for b in lower)],
        config=config,
        python=f"{plan.target['venv']}/bin/python",
        network=options.network,
        engine=options.engine or DockerEngine(),
    )
