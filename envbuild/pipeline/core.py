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

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from envbuild import progress
from envbuild.build import image, layers, noop
from envbuild.build.basestage import base_stage
from envbuild.build.fetch import fetch_wheels
from envbuild.build.layerbuild import LayerInputs, build_layers
from envbuild.build.links import link_check
from envbuild.build.manifest import BaseResult, BuildManifest, stored_layer
from envbuild.build.outputs import Contents, Sbom, guard_output, output_files, write_outputs
from envbuild.build.overlaps import overlap_report
from envbuild.build.plan import Plan, PlanLayer, resolve_layer
from envbuild.build.sbom import image_sbom
from envbuild.build.stages import Layers, Lower, Made, Wheels, stage, stage_times
from envbuild.engine import ContainerEngine, DockerEngine
from envbuild.lock.base import spec_path
from envbuild.lock.core import find_lock
from envbuild.lock.model import Lock
from envbuild.pipeline.planner import (
    COMPRESSION,
    compression_of,
    load_lock,
    make_plan,
    plan_target,
    wheel_refs,
)
from envbuild.sourcebuild.builder import Builder, HostBuilder
from envbuild.sourcebuild.sources import SourceOutcome, SourcesResult, realize_sources
from envbuild.spec import LoadedSpec
from envbuild.store.core import Store, output_root_name

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuilderOptions:
    """Where source builds run: ``host`` (a build venv here) or ``container`` (a builder
    container made from the image's own lower layers, on ``engine`` (default: the Docker engine
    at the default socket), attached to ``network``)."""

    mode: Literal["host", "container"] = "host"
    network: str = "host"
    engine: ContainerEngine | None = None


@dataclass(frozen=True)
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
    builder: BuilderOptions | None = None,
) -> ImageBuild:
    """Build ``loaded``'s image into ``output`` (default ``<repo>/images/<spec-name>``).

    The layers whose key the plan knows (base, venv, big distributions, groups, an unpatched
    vLLM) are built first; then the sources stage realizes the source builds and patches (a
    builder container needs those lower layers) and the layers installing them get their keys."""
    start, options = time.perf_counter(), builder or BuilderOptions()
    timings: dict[str, float] = {}
    # taken before the build reads anything: what changes while it runs is not recorded as built
    before = _Before.of(loaded, output, compression, docker_archive, options, dry_run=dry_run)
    with stage("plan", timings):
        lock, lock_hash = load_lock(loaded)
        plan = make_plan(loaded, lock, lock_hash=lock_hash, compression=compression)
    if dry_run:
        return ImageBuild(None, plan, None, timings)
    out = output if output is not None else loaded.root / "images" / loaded.name
    with store.session():
        low = _lower(loaded, lock, plan, store, timings)
        with stage("sources", timings):
            plan, sources = _sources(loaded, lock, plan, store, low, options)
        with stage("layers", timings):
            top = _layers([x for x in plan.layers if x.name not in low.layers.built], low.wheels)
        built = low.layers + top
        with stage("links", timings):
            links = link_check(loaded, plan, low.base, low.wheels.inputs)
        # two builds into one folder take turns, each writing the folder and then its root
        with guard_output(out):
            noop.forget(store.root, before.request)  # written again once the folder is whole
            with stage("image", timings):
                made = _image(plan, lock, store, low, built, sources, out, docker_archive)
            with stage("root", timings):
                keys = [*low.base.keys, low.wheels.key, links, *sources.keys, made.sbom_key]
                files = _root(plan, store, out, made.manifest, keys)
                before.record(store, lock_hash, out, made.manifest.image, files, sources)
    wall = time.perf_counter() - start
    # the stages overlap (the base is made beside the layers), so they do not add up to the wall
    # time; `envbuild -v build` shows them (--json is the build manifest: the same bytes each time)
    log.debug("stages: %s; wall %.2f s", stage_times(timings), wall)
    return ImageBuild(
        made.manifest, plan, out, timings, wall, built.rebuilt, built.reused, sources.outcomes
    )


@dataclass(frozen=True)
class _Before:
    """What the no-op record of a build (:mod:`.noop`) is made of, taken before the build reads
    anything: the request, the fingerprint of the tools, the sha256 of every input file (None
    for a dry run, or when an input is missing: then nothing is recorded)."""

    request: noop.Request
    fingerprint: str | None
    inputs: dict[str, str] | None

    @classmethod
    def of(
        cls,
        loaded: LoadedSpec,
        output: Path | None,
        compression: layers.Compression,
        docker_archive: bool,
        options: BuilderOptions,
        *,
        dry_run: bool,
    ) -> _Before:
        request = noop.Request.of(
            loaded.path,
            output,
            compression=compression.value,
            docker_archive=docker_archive,
            builder=options.mode,
            builder_network=options.network,
        )
        if dry_run:
            return cls(request, None, None)
        return cls(request, noop.fingerprint(), _inputs(loaded))

    def record(
        self,
        store: Store,
        lock_hash: str,
        out: Path,
        image_digest: str,
        files: dict[str, str],
        sources: SourcesResult,
    ) -> None:
        """Record that ``out`` holds the image, when the lock read was the one hashed before."""
        if self.fingerprint is None or not self.inputs or lock_hash not in self.inputs.values():
            return
        noop.write_record(
            store.root,
            self.request,
            fingerprint=self.fingerprint,
            inputs=self.inputs,
            output=out,
            image=image_digest,
            files=files,
            sources=[
                {"kind": o.kind, "dist": o.dist, "version": o.version, "key": o.key}
                for o in sources.outcomes
            ],
        )


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
) -> Builder:
    """The builder ``envbuild build`` runs ``loaded``'s source builds in (what ``envbuild store
    add-wheel`` keys a wheel for): a builder container needs the image's lower layers, which are
    built here, or found in the store."""
    if options.mode == "host":
        return HostBuilder(loaded.spec.python.version)
    lock, lock_hash = load_lock(loaded)
    plan = make_plan(loaded, lock, lock_hash=lock_hash, compression=compression)
    with store.session():
        return _builder(options, loaded, plan, store, _lower(loaded, lock, plan, store))


def _lower(
    loaded: LoadedSpec,
    lock: Lock,
    plan: Plan,
    store: Store,
    timings: dict[str, float] | None = None,
) -> Lower:
    """fetch, base and the layers whose key the plan knows (everything but the provisional).

    The base is made in a thread of its own while the wheels are fetched and the Python layers
    installed and packed: neither needs the other (a layer holds the venv's files, not the
    base's), and mmdebstrap spends most of its time in one process (dpkg and maintainer
    scripts), so on two cores the layers take the other."""
    comp = compression_of(plan)
    lower = [layer for layer in plan.layers if not layer.provisional]

    def make_base() -> BaseResult:
        with stage("base", timings):
            return base_stage(loaded, lock, store, comp, plan.source_date_epoch)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="envbuild-base") as side:
        base = side.submit(progress.carried(make_base))
        with stage("fetch", timings):
            wheels = _fetch(loaded, lock, plan, store, lower)
        with stage("layers", timings):
            made = _layers(lower, wheels, defer_to=base)
        return Lower(base.result(), wheels, made)


def _fetch(
    loaded: LoadedSpec, lock: Lock, plan: Plan, store: Store, lower: list[PlanLayer]
) -> Wheels:
    """The wheels of the layers in ``lower`` the store lacks, and the overlap report."""
    target, refs = plan_target(plan), wheel_refs(lock, plan)
    todo = [layer for layer in lower if not store.available(layer.key)]
    needed = {d.sha256 for layer in todo for d in layer.dists}
    blobs = fetch_wheels([w for w in refs if w.sha256 in needed], store)
    overlaps, leaves, key = overlap_report(loaded, refs, store, target)
    by_sha = {w.sha256: w for w in refs}
    inputs = LayerInputs(store, blobs, by_sha, leaves, target, compression_of(plan))
    return Wheels(inputs, overlaps, key)


def _layers(todo: list[PlanLayer], wheels: Wheels, defer_to: Future[Any] | None = None) -> Layers:
    """Install and pack ``todo`` (:func:`~envbuild.build.layerbuild.build_layers`); none when
    ``defer_to`` (the base) failed: that is the caller's to raise."""
    got = build_layers(todo, wheels.inputs, defer_to=defer_to)
    if got is None:
        return Layers()
    return Layers(
        {layer.name: built for layer, (built, _) in zip(todo, got, strict=True)},
        [layer.name for layer, (_, reused) in zip(todo, got, strict=True) if not reused],
        [layer.name for layer, (_, reused) in zip(todo, got, strict=True) if reused],
    )


def _sources(
    loaded: LoadedSpec,
    lock: Lock,
    plan: Plan,
    store: Store,
    low: Lower,
    options: BuilderOptions,
) -> tuple[Plan, SourcesResult]:
    """The source builds and patches, and the plan with the layers installing them resolved;
    the wheels they made join the files the later stages read."""
    made = realize_sources(
        loaded,
        lock,
        store,
        lambda: _builder(options, loaded, plan, store, low),
        locked={w.canonical: w for w in low.wheels.inputs.by_sha.values()},
    )
    resolved = plan.with_layers(
        [
            resolve_layer(layer, made.wheels[layer.name].wheel, made.wheels[layer.name].sources)
            if layer.provisional
            else layer
            for layer in plan.layers
        ]
    )
    low.wheels.inputs.blobs.update({r.wheel.sha256: r.path for r in made.wheels.values()})
    return resolved, made


def _image(
    plan: Plan,
    lock: Lock,
    store: Store,
    low: Lower,
    built: Layers,
    sources: SourcesResult,
    out: Path,
    docker_archive: bool,
) -> Made:
    """The image, its SBOM and the build manifest, written into the output folder ``out``."""
    made_wheels = {r.wheel.sha256: r.path for r in sources.wheels.values()}
    sbom_keys: list[str] = []

    def sbom_of(built_manifest: BuildManifest) -> Sbom:
        by_sha = low.wheels.inputs.by_sha
        made_sbom, key = image_sbom(
            plan, lock, built_manifest, store, by_sha=by_sha, made=made_wheels
        )
        sbom_keys.append(key)
        return made_sbom

    contents = Contents(low.base, built.built, low.wheels.overlaps, sources.builds, sources.patches)
    manifest = write_outputs(
        plan,
        store,
        contents,
        out,
        docker_archive=docker_archive,
        created=image.created_for(lock.envbuild.exclude_newer, plan.created),
        sbom=sbom_of,
    )
    return Made(manifest, sbom_keys[0])


def _root(
    plan: Plan, store: Store, out: Path, manifest: BuildManifest, keys: list[str]
) -> dict[str, str]:
    """One root per output folder, as Nix has one per out-link: it keeps what the folder's
    image needs until the folder is removed or holds another image. Besides the layers, the
    derivations ``keys`` (the overlap report, a Debian resolution, the source builds and patched
    wheels, the link check, the SBOM): gc must not make the next build redo them. Returns the
    stat of each file the folder holds."""
    files = output_files(out, manifest)
    store.set_root(
        output_root_name(out),
        blobs=[manifest.image, manifest.config, *(b.digest for b in manifest.layers)],
        derivations=[*(layer.key for layer in plan.layers), *keys],
        output=out,
        image=manifest.image,
        files=files,
    )
    return files


def _builder(
    options: BuilderOptions, loaded: LoadedSpec, plan: Plan, store: Store, low: Lower
) -> Builder:
    """The builder source builds run in; a builder container's image is the base and every
    layer built so far (venv, torch and the rest), with the image's env."""
    if options.mode == "host":
        return HostBuilder(loaded.spec.python.version)
    from envbuild.sourcebuild.container import ContainerBuilder

    built = low.layers.built
    lower = [built[layer.name] for layer in plan.layers if layer.name in built]
    config = image.OciImageConfig(env=plan.config.env, cmd=["/bin/sh"]).merged_over(low.base.config)
    return ContainerBuilder(
        store,
        layers=[*low.base.layers, *(stored_layer(store, b) for b in lower)],
        config=config,
        python=f"{plan.target['venv']}/bin/python",
        network=options.network,
        engine=options.engine or DockerEngine(),
        epoch=plan.source_date_epoch if plan.created is not None else None,
    )
