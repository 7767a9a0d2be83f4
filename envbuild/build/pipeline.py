"""`envbuild build`: spec + lock -> a layered, bit-for-bit reproducible OCI image, no daemon.

A chain of explicit stages, each one's errors wrapped with its name (apko's habit):

    plan  -> the layer plan from the spec and the lock alone (what ``--dry-run`` prints)
    fetch -> every locked wheel into the store, size and sha256 checked; overlaps checked
    base  -> the base's layers (Debian rootfs, registry image, OCI layout or rootfs tarball)
    layer -> per planned layer: install its distributions with uv into a fresh staging root
             and pack it (deterministic tar, zstd) — skipped when the store has its key
    image -> config, manifest, OCI layout and a ``docker load`` archive under the output dir
    root  -> the store keeps what the image needs alive through ``gc``

Every layer is a store derivation keyed by the plan's key, so an unchanged layer is neither
installed nor packed again, and a no-op rebuild only re-reads the store's records.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Literal, cast

from packaging.utils import canonicalize_name

from envbuild import oci, scratch
from envbuild.build import image, layers, ocilayout
from envbuild.build.entries import Kind, tree_entries
from envbuild.build.fetch import fetch_wheels
from envbuild.build.install import (
    INSTALL_FORMAT,
    VenvTarget,
    WheelRef,
    find_overlaps,
    install,
    resolve_overlaps,
    uv_version,
    wheel_files,
    write_venv,
)
from envbuild.build.manifest import (
    BaseResult,
    BuildManifest,
    BuiltLayer,
    Sbom,
    output_files,
    stored_layer,
    write_outputs,
)
from envbuild.build.plan import (
    IMAGE_BASE_LAYERS,
    LayerKind,
    Plan,
    PlanBase,
    PlanDist,
    PlanLayer,
    PlanOptions,
    image_config,
    key_of,
    layer_plan,
    resolve_layer,
    select_wheels,
)
from envbuild.engine import ContainerEngine, DockerEngine
from envbuild.errors import EnvbuildError, EnvironmentFailure, UserError
from envbuild.fsio import canonical_json, sha256_file
from envbuild.lock import Lock, find_lock, read_lock
from envbuild.lock.model import DebianBaseLock
from envbuild.progress import NULL, Progress
from envbuild.sourcebuild.builder import Builder, HostBuilder
from envbuild.sourcebuild.requests import describe
from envbuild.sourcebuild.sources import SourceOutcome, realize_sources
from envbuild.spec import LoadedSpec
from envbuild.store.core import Output, Store, output_root_name

log = logging.getLogger("envbuild.build.pipeline")

#: Layer compression unless asked otherwise: zstd packs several times faster than gzip; gzip is
#: read by every tool (umoci 0.4, Docker before 23).
COMPRESSION = layers.Compression.ZSTD
#: uv's cache of unzipped wheels, inside the store's tmp/ (so `envbuild gc` clears it): a layer
#: rebuilt after one of its distributions changed copies the others instead of unzipping them.
UV_CACHE = "uv-cache"
#: A layer's staging tree plus uv's unzipped copy, per byte of its wheels (wheels unzip to about
#: 2-3 times their size): what a scratch folder in memory must have room for.
STAGING_PER_WHEEL_BYTE = 6
#: Layers installed and packed at once.
WORKERS = 2


class StageError(EnvironmentFailure):
    """Wraps an unexpected failure of one stage with the stage's name."""


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


# --- the plan ---------------------------------------------------------------------------------


def target_of(loaded: LoadedSpec, lock: Lock) -> VenvTarget:
    py = loaded.spec.python
    return VenvTarget(
        venv=py.venv,
        interpreter=py.interpreter,
        python_version=lock.envbuild.python,
        platform=lock.envbuild.platform,
    )


def pack_options(compression: layers.Compression) -> dict[str, str | int]:
    return {
        "compression": compression.value,
        "compressor": layers.compressor_id(compression),
        "tar": "gnu-sorted-1",
    }


def _compression(plan: Plan) -> layers.Compression:
    return layers.Compression(str(plan.pack["compression"]))


def make_plan(
    loaded: LoadedSpec,
    lock: Lock,
    *,
    lock_hash: str,
    compression: layers.Compression = COMPRESSION,
) -> Plan:
    """The plan from the spec and its lock; reads nothing but them (and asks uv its version)."""
    spec = loaded.spec
    meta = lock.envbuild
    target = target_of(loaded, lock)
    builds = {canonicalize_name(b.name): b for b in meta.builds}
    wheels = select_wheels(lock, skip=frozenset(builds))
    installer = uv_version()
    pack = pack_options(compression)
    sde = layers.source_date_epoch()
    base = _plan_base(loaded, lock, pack)
    top = []
    kinds: dict[str, LayerKind] = {}
    if spec.vllm:
        top.append("vllm")
    for name in sorted({*map(canonicalize_name, spec.patches)} - set(builds)):
        if name != "vllm":
            top.append(name)
        kinds[name] = "patch"
    options = PlanOptions(max_layers=spec.image.max_layers)
    planned = layer_plan(
        wheels,
        target=target,
        installer=installer,
        pack=pack,
        source_date_epoch=sde,
        options=options,
        base_layers=base.layers,
        top=top,
        kinds=kinds,
        overlap_rules=_overlap_rules(loaded, wheels),
    )
    for name, b in sorted(builds.items()):
        inputs = {
            "layer": "build",
            "install_format": INSTALL_FORMAT,
            "installer": installer,
            "target": target.key(),
            "pack": pack,
            "sdist": {"filename": b.sdist.name, "sha256": b.sdist.hashes.sha256},
            "env": dict(sorted(b.env.items())),
            "source_date_epoch": sde,
        }
        dist = PlanDist(
            name=name,
            version=b.version,
            filename=b.sdist.name,
            sha256=b.sdist.hashes.sha256,
            size=b.sdist.size,
        )
        planned.append(
            PlanLayer(
                name=name,
                kind="build",
                key=key_of("layer", inputs),
                inputs=inputs,
                dists=[dist],
                wheel_bytes=b.sdist.size,
                provisional=True,
            )
        )
    return Plan(
        spec=spec.name,
        spec_hash=loaded.spec_hash(),
        lock_hash=lock_hash,
        source_date_epoch=sde,
        target={k: v for k, v in target.key().items() if isinstance(v, str | None)},
        installer=installer,
        pack=pack,
        options=options,
        base=base,
        layers=planned,
        config=image_config(spec, spec_hash=loaded.spec_hash(), lock_hash=lock_hash),
        sources=describe(loaded, lock),
    )


def _overlap_rules(loaded: LoadedSpec, wheels: list[WheelRef]) -> dict[str, dict[str, str]]:
    """For each losing distribution of a spec rule: the winner and its wheel's sha256 (what
    decides which paths the loser's layer leaves out)."""
    by_name = {w.canonical: w for w in wheels}
    out: dict[str, dict[str, str]] = {}
    for loser, winner in loaded.spec.image.overlaps.items():
        lo, wi = canonicalize_name(loser), canonicalize_name(winner)
        if lo in by_name and wi in by_name:
            out[lo] = {"winner": wi, "sha256": by_name[wi].sha256}
    return out


def _plan_base(loaded: LoadedSpec, lock: Lock, pack: dict[str, str | int]) -> PlanBase:
    base = loaded.spec.base
    locked = lock.envbuild.base
    if base.kind == "debian":
        extra = f" + {', '.join(base.packages)}" if base.packages else ""
        description = f"debian {base.suite} ({base.variant}){extra}"
        count = 1
    elif base.kind == "image":
        description, count = base.ref, IMAGE_BASE_LAYERS
    elif base.kind == "oci-layout":
        description, count = f"oci-layout {base.path}", IMAGE_BASE_LAYERS
    else:
        description, count = f"rootfs {base.path} ({base.sha256[:12]})", 1
    inputs = {
        "spec": base.model_dump(mode="json"),
        "lock": locked.model_dump(mode="json", by_alias=True) if locked else None,
        "pack": pack,
    }
    return PlanBase(
        kind=base.kind, description=description, key=key_of("base", inputs), layers=count
    )


@dataclass(frozen=True)
class BuilderOptions:
    """Where source builds run: ``host`` (a build venv here) or ``container`` (a builder
    container made from the image's own lower layers, on ``engine`` (default: the Docker engine
    at the default socket), attached to ``network``)."""

    mode: Literal["host", "container"] = "host"
    network: str = "host"
    engine: ContainerEngine | None = None


@dataclass
class BuildResult:
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


def load_lock(loaded: LoadedSpec) -> tuple[Lock, str]:
    """The spec's lock and the sha256 of its bytes; refuses a lock made from another spec."""
    path = find_lock(loaded)
    lock = read_lock(path)
    if lock.envbuild.spec_hash != loaded.spec_hash():
        raise UserError(
            f"{loaded.display(path)} was locked from another version of "
            f"{loaded.display(loaded.path)} (spec hash {lock.envbuild.spec_hash[:12]}, now "
            f"{loaded.spec_hash()[:12]})",
            hint=f"run `envbuild lock {loaded.display(loaded.path)}`",
        )
    return lock, sha256_file(path)


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
) -> BuildResult:
    """Build ``loaded``'s image into ``output`` (default ``<repo>/images/<spec-name>``).

    The layers whose key the plan knows (base, venv, big distributions, groups, an unpatched
    vLLM) are built first; then the sources stage realizes the source builds and patches (a
    builder container needs those lower layers) and the layers installing them get their keys.
    """
    start = time.perf_counter()
    timings: dict[str, float] = {}
    with stage("plan", timings):
        lock, lock_hash = load_lock(loaded)
        plan = make_plan(loaded, lock, lock_hash=lock_hash, compression=compression)
    out = output if output is not None else loaded.root / "images" / loaded.name
    if dry_run:
        return BuildResult(None, plan, None, timings)
    result = BuildResult(None, plan, out, timings)
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
            _links(loaded, plan, store, low, blobs, progress)
        made_wheels = {r.wheel.sha256: r.path for r in made.wheels.values()}
        sbom_keys: list[str] = []

        def sbom_of(built_manifest: BuildManifest) -> Sbom:
            made_sbom, key = _sbom(plan, lock, built_manifest, store, low, made_wheels, progress)
            sbom_keys.append(key)
            return made_sbom

        # two builds into one folder take turns, each writing the folder and then its root
        with store.lock_output(out):
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
                    files=output_files(out, manifest),
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


def _sbom(
    plan: Plan,
    lock: Lock,
    manifest: BuildManifest,
    store: Store,
    low: _Lower,
    made: dict[str, Path],
    progress: Progress,
) -> tuple[Sbom, str]:
    """The image's CycloneDX SBOM (:mod:`envbuild.build.sbom`) and its OCI 1.1 referrer, all three
    blobs (document, empty config, artifact manifest) made once per build manifest and kept in
    the store (a no-op rebuild reads no wheel). Returns them and the derivation's key;
    :func:`~envbuild.build.manifest.write_outputs` puts them into the output folder."""
    from envbuild.build import sbom

    created = image.created_for(lock.envbuild.exclude_newer)
    inputs = {
        "format": sbom.SBOM_FORMAT,
        "manifest": canonical_json(manifest.model_dump(mode="json")),
    }

    def make() -> Output:
        shas = [d.sha256 for layer in plan.layers for d in layer.dists if d.sha256 not in made]
        wanted = [low.by_sha[sha] for sha in shas if sha in low.by_sha]
        paths = {**fetch_wheels(wanted, store, progress=progress), **made}
        data = sbom.make_sbom(
            manifest, plan, lock, created=datetime.fromisoformat(created),
            license_of=lambda sha: sbom.wheel_license(paths[sha]) if sha in paths else None,
        )  # fmt: skip
        subject = {"mediaType": oci.OCI_MANIFEST, "digest": manifest.image,
                   "size": store.blob_path(manifest.image).stat().st_size}  # fmt: skip
        art = sbom.artifact_manifest(subject, data, created=created)
        return Output(
            outputs={
                "sbom": store.add_bytes(data),
                "config": store.add_bytes(sbom.EMPTY_JSON),
                "manifest": store.add_bytes(art),
            }
        )

    drv = store.build("sbom", inputs, make).drv
    data = store.read_blob(drv.outputs["sbom"])
    art = drv.outputs["manifest"]
    referrer = ocilayout.Referrer(
        descriptor={
            "mediaType": sbom.OCI_MANIFEST,
            "artifactType": sbom.MEDIA_TYPE,
            "digest": art,
            "size": store.blob_path(art).stat().st_size,
        },
        blobs=(drv.outputs["sbom"], drv.outputs["config"], art),
    )
    log.debug("sbom %s (key %s)", drv.outputs["sbom"], drv.key[:12])
    return Sbom(data=data, referrer=referrer), drv.key


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
        low = _lower(loaded, lock, plan, store, progress, BuildResult(None, plan, None))
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
    result: BuildResult,
) -> _Lower:
    """fetch, base and the layers whose key the plan knows (everything but the provisional).

    The base is made in a thread of its own while the wheels are fetched and the Python layers
    installed and packed: neither needs the other (a layer holds the venv's files, not the
    base's), and mmdebstrap spends most of its time in one process (dpkg and maintainer
    scripts), so on two cores the layers take the other."""
    timings = result.timings
    kept: list[str] = []
    target, comp = _target(plan), _compression(plan)
    lower = [layer for layer in plan.layers if not layer.provisional]
    wheels = _wheel_refs(lock, plan)

    def base_stage() -> BaseResult:
        with stage("base", timings):
            return _base_stage(loaded, lock, store, comp, progress, kept)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="envbuild-base") as side:
        base = side.submit(base_stage)
        with stage("fetch", timings):
            todo = [layer for layer in lower if not store.available(layer.key)]
            needed = {d.sha256 for layer in todo for d in layer.dists}
            blobs = fetch_wheels(
                [w for w in wheels if w.sha256 in needed], store, progress=progress
            )
            overlaps, leaves = _overlaps(loaded, wheels, store, target, progress, kept)
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
    result: BuildResult,
    defer_to: Future[Any] | None = None,
) -> None:
    """Install and pack ``todo`` (or find them in the store), ``WORKERS`` at a time; while
    ``defer_to`` runs, at a lower priority (see :func:`_defer`). When a layer fails, or
    ``defer_to`` does, the layers not started yet are dropped and this returns once the running
    ones finish (what they made stays in the store): a failed base is the caller's to raise."""
    init = (lambda: _defer(defer_to)) if defer_to is not None else None
    with ThreadPoolExecutor(max_workers=WORKERS, initializer=init) as pool:
        jobs = {
            layer.name: pool.submit(
                _layer,
                layer,
                store,
                low.blobs,
                low.by_sha,
                low.leaves,
                low.target,
                low.compression,
                progress,
            )
            for layer in todo
        }
        pending: set[Future[Any]] = set(jobs.values())
        base = {defer_to} if defer_to is not None else set()
        while pending:
            done, _ = wait(pending | base, return_when=FIRST_COMPLETED)
            if any(f.exception() is not None for f in done):
                pool.shutdown(cancel_futures=True)
                break
            pending -= done
            base -= done
    if defer_to is not None and defer_to.done() and defer_to.exception() is not None:
        return
    for layer in todo:  # the pool takes jobs in this order: none dropped before a failed one
        got, reused = jobs[layer.name].result()  # raises the first failed layer's error
        low.built[layer.name] = got
        (result.reused if reused else result.rebuilt).append(layer.name)


#: The niceness of the layer workers while the base is being made.
DEFERRED_NICE = 10


def _defer(other: Future[Any]) -> None:
    """Lower this thread's priority (and so that of the uv and zstd it starts, and the threads
    it makes) while ``other`` is still running. mmdebstrap is one long chain of mostly serial
    work, the base's critical path, while the layers are parallel work that can fill the other
    cores: on two cores, an equal share slowed mmdebstrap from 25 s to 40 s and the build with
    it. Linux keeps a niceness per thread; elsewhere this changes nothing."""
    if other.done():
        return
    with contextlib.suppress(OSError, AttributeError):
        now = os.getpriority(os.PRIO_PROCESS, 0)
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), max(now, DEFERRED_NICE))


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


def _target(plan: Plan) -> VenvTarget:
    t = plan.target
    return VenvTarget(
        venv=str(t["venv"]),
        interpreter=str(t["interpreter"]),
        python_version=str(t["python_version"]),
        platform=t.get("platform"),
    )


def _wheel_refs(lock: Lock, plan: Plan) -> list[WheelRef]:
    """The locked wheels the plan's layers install (a patched distribution's original too)."""
    by_sha = {
        w.sha256: w
        for w in select_wheels(
            lock, skip=frozenset(layer.name for layer in plan.layers if layer.kind == "build")
        )
    }
    return [by_sha[d.sha256] for layer in plan.layers for d in layer.dists if d.sha256 in by_sha]


def _overlaps(
    loaded: LoadedSpec,
    wheels: list[WheelRef],
    store: Store,
    target: VenvTarget,
    progress: Progress,
    kept: list[str],
) -> tuple[list[dict[str, Any]], dict[str, frozenset[str]]]:
    """Compare every wheel's RECORD before anything is installed (a derivation of the wheel set
    and the spec's rules, so a no-op rebuild does not read the wheels). An overlap the spec does
    not settle is an error naming both distributions and the paths."""
    rules: dict[str, str] = {
        canonicalize_name(k): canonicalize_name(v) for k, v in loaded.spec.image.overlaps.items()
    }
    inputs = {
        "wheels": sorted(w.sha256 for w in wheels),
        "rules": rules,
        "site_packages": target.site_packages,
        "install_format": INSTALL_FORMAT,
    }

    def builder() -> Output:
        blobs = fetch_wheels(wheels, store, progress=progress)
        files = {w.canonical: wheel_files(blobs[w.sha256], target) for w in wheels}
        resolved, remove = resolve_overlaps(find_overlaps(files), rules)
        report = {
            "overlaps": [ov.as_dict() for ov in resolved],
            "leaves_out": {k: sorted(v) for k, v in sorted(remove.items())},
        }
        return Output(outputs={"report": store.add_bytes(canonical_json(report).encode())})

    drv = store.build("overlaps", inputs, builder).drv
    kept.append(drv.key)
    report = json.loads(store.read_blob(drv.outputs["report"]))
    leaves = {k: frozenset(v) for k, v in report["leaves_out"].items()}
    return list(report["overlaps"]), leaves


#: Bumped when what the link check finds for the same wheels and base changes.
LINKCHECK_FORMAT = 1


def _links(
    loaded: LoadedSpec,
    plan: Plan,
    store: Store,
    low: _Lower,
    blobs: dict[str, Path],
    progress: Progress,
) -> None:
    """The link check of the image (envbuild.linkcheck): a derivation of its wheels and base,
    so a no-op rebuild only reads its report. A finding the spec does not accept in
    ``[image.link_findings]`` stops the build (exit 2); the layers made stay in the store."""
    from envbuild import linkcheck
    from envbuild.errors import LinkFindings
    from envbuild.linkcheck.wheels import Wheel, check_image

    dists = {d.sha256: d for layer in plan.layers for d in layer.dists}
    inputs = {
        "wheels": sorted(dists),
        "base": [layer.digest for layer in low.base.layers],
        "target": low.target.key(),
        "leaves_out": {k: sorted(v) for k, v in sorted(low.leaves.items())},
        "format": LINKCHECK_FORMAT,
    }

    def builder() -> Output:
        if missing := [low.by_sha[s] for s in dists if s not in blobs and s in low.by_sha]:
            blobs.update(fetch_wheels(missing, store, progress=progress))
        wheels = [Wheel(d.name, d.version, blobs[s], s) for s, d in sorted(dists.items())]
        torch = next((d.version for d in dists.values() if d.name == "torch"), None)
        base = [(store.blob_path(layer.digest), layer.media_type) for layer in low.base.layers]
        with (
            progress.task("link check", len(wheels), unit="dists") as task,
            store.temp_dir("links-") as work,
        ):
            report = check_image(
                wheels,
                base,
                low.target,
                work,
                cache=linkcheck.Cache(linkcheck.default_cache()),
                torch=torch,
                leaves=low.leaves,
                base_digests=[layer.digest for layer in low.base.layers],
            )
            task.advance(len(wheels))
        return Output(
            outputs={"report": store.add_bytes(canonical_json(report.as_dict()).encode())}
        )

    drv = store.build("links", inputs, builder).drv
    low.kept.append(drv.key)
    data = json.loads(store.read_blob(drv.outputs["report"]))
    accept = loaded.spec.image.link_findings
    found = [linkcheck.Finding.from_dict(f) for f in data["findings"]]
    if bad := [f for f in found if f.id not in accept]:
        raise LinkFindings(f"image {plan.spec}", [f.line() for f in bad], [f.id for f in bad])


def _layer(
    layer: PlanLayer,
    store: Store,
    blobs: dict[str, Path],
    by_sha: dict[str, WheelRef],
    leaves: dict[str, frozenset[str]],
    target: VenvTarget,
    compression: layers.Compression,
    progress: Progress,
) -> tuple[BuiltLayer, bool]:
    """One planned layer from the store, or installed and packed now under its key."""
    names = [d.name for d in layer.dists]
    left = {d: sorted(leaves[d]) for d in names if d in leaves}

    def builder() -> Output:
        if missing := [by_sha[d.sha256] for d in layer.dists if d.sha256 not in blobs]:
            # the remote cache said it had this layer, then did not deliver it
            blobs.update(fetch_wheels(missing, store, progress=progress))
        refs = [(d.ref(""), blobs[d.sha256]) for d in layer.dists]
        # the staging tree and the wheels uv unzips for it, in memory when there is room
        needed = STAGING_PER_WHEEL_BYTE * sum(path.stat().st_size for _, path in refs)
        with (
            scratch.folder("stage-", needed) as fast,
            store.temp_dir("stage-") if fast is None else contextlib.nullcontext(fast) as work,
        ):
            root = work / "root"
            root.mkdir()
            if layer.kind == "venv":
                write_venv(root, target)
            else:
                with progress.task(f"install {layer.name}", len(refs), unit="dists") as task:
                    install(
                        refs,
                        target,
                        root,
                        remove={d: leaves[d] for d in left},
                        cache=work / UV_CACHE if fast is not None else store.tmp / UV_CACHE,
                    )
                    task.advance(len(refs))
            packed = pack(
                store,
                root,
                layer.name,
                compression=compression,
                mtime=int(layer.inputs["source_date_epoch"]),
                progress=progress,
            )
        return Output(
            outputs={"layer": packed.digest},
            meta={**packed.model_dump(mode="json"), "leaves_out": left},
        )

    realized = store.build("layer", layer.inputs, builder)
    meta = realized.drv.meta
    return (
        BuiltLayer(
            name=layer.name,
            kind=layer.kind,
            key=layer.key,
            digest=realized.drv.outputs["layer"],
            diff_id=str(meta["diff_id"]),
            size=int(meta["size"]),
            media_type=str(meta["media_type"]),
            distributions=[f"{d.name}=={d.version}" for d in layer.dists],
            leaves_out={k: list(v) for k, v in dict(meta.get("leaves_out", {})).items()},
        ),
        realized.reused,
    )


def pack(
    store: Store,
    root: Path,
    name: str,
    *,
    compression: layers.Compression,
    mtime: int,
    progress: Progress = NULL,
) -> layers.Layer:
    """Pack the staging tree ``root`` as one deterministic layer, reporting bytes read."""
    entries = tree_entries(root)
    total = sum(e.size for e in entries if e.kind is Kind.FILE)
    with progress.task(f"pack {name}", total) as task:
        counted = [
            replace(e, source=_counting_opener(e.source, task.advance))
            if isinstance(e.source, Path)
            else e
            for e in entries
        ]
        return layers.write_layer(store, counted, compression=compression, mtime=mtime)


class _Counting(io.RawIOBase):
    def __init__(self, f: io.RawIOBase, advance: Callable[[int], None]) -> None:
        self._f, self._advance = f, advance

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        n = self._f.readinto(buf)
        if n:
            self._advance(n)
        return n or 0

    def close(self) -> None:
        self._f.close()
        super().close()


def _counting_opener(path: Path, advance: Callable[[int], None]) -> Callable[[], IO[bytes]]:
    def opener() -> IO[bytes]:
        raw = cast(io.RawIOBase, path.open("rb", buffering=0))
        return cast(IO[bytes], _Counting(raw, advance))

    return opener


# --- the base ---------------------------------------------------------------------------------


def _base_stage(
    loaded: LoadedSpec,
    lock: Lock,
    store: Store,
    compression: layers.Compression,
    progress: Progress,
    kept: list[str],
) -> BaseResult:
    """The base's layers from the store, built or pulled once per store (see
    envbuild.build.base)."""
    from envbuild.build.base import build_base

    pinned = lock.envbuild.base
    if isinstance(pinned, DebianBaseLock) and not pinned.packages:
        pinned = _debian_resolution(loaded, lock, store, compression, kept)
    with progress.task(f"base {loaded.spec.base.kind}", None, unit="layers"):
        got = build_base(store, loaded, pinned, compression=compression)
    return BaseResult(
        layers=list(got.layers),
        config=got.config,
        history=list(got.history),
        info={"key": got.key, "lock": got.lock.model_dump(mode="json", by_alias=True)},
    )


def _debian_resolution(
    loaded: LoadedSpec, lock: Lock, store: Store, compression: layers.Compression, kept: list[str]
) -> DebianBaseLock:
    """A lock whose Debian base names no package set is resolved against the mirror once per
    store (a derivation of the base's spec and the lock's cutoff), not at every build: neither a
    no-op rebuild nor a bumped Python package runs mmdebstrap again. Pinning the set in the lock
    itself makes it the same on every machine."""
    from envbuild.build.base import debian

    spec_base = loaded.spec.base
    locked = lock.envbuild
    inputs = {
        "base": spec_base.model_dump(mode="json"),
        "locked": locked.base.model_dump(mode="json") if locked.base else None,
        "exclude_newer": locked.exclude_newer.isoformat(),
    }

    def builder() -> Output:
        resolved = debian.resolve(store, spec_base, compression=compression)
        data = canonical_json(resolved.model_dump(mode="json", by_alias=True)).encode()
        return Output(outputs={"lock": store.add_bytes(data)})

    drv = store.build("debian-resolution", inputs, builder).drv
    kept.append(drv.key)
    return DebianBaseLock.model_validate_json(store.read_blob(drv.outputs["lock"]))
