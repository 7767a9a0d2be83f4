"""The sources stage of ``envbuild build``: source builds and patched wheels, made before the
layers that install them.

Each ``[builds]`` entry is realized by :func:`envbuild.sourcebuild.realise.realize` (a derivation
keyed by
the sdist, torch, the toolchain, the flags …; built on the host or in a builder container, see
:mod:`envbuild.sourcebuild.builder`), each ``[patches]`` set by
:func:`envbuild.sourcebuild.patches.realize_patch` (keyed by
the wheel's and the patches' sha256), a patch of a source-built distribution applying to the
built wheel. The answer, per distribution, is the wheel its top layer installs and the keys of the
derivations that made it: :func:`envbuild.build.plan.resolve_layer` turns them into the layer's
key, so
a changed flag or patch rebuilds that wheel and that layer only.

A patch already in the store is found by its key, computed from the lock's sha256 of the wheel:
a no-op rebuild neither downloads nor hashes the (vLLM-sized) wheel it patches.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import parse_wheel_filename

from envbuild.build.fetch import fetch_wheels
from envbuild.build.install import WheelRef
from envbuild.build.manifest import PatchRecord, SourceBuildRecord
from envbuild.errors import ManifestError
from envbuild.lock import Lock
from envbuild.progress import NULL, Progress
from envbuild.sourcebuild import patches as patches_mod
from envbuild.sourcebuild import realise as sourcebuild
from envbuild.sourcebuild.builder import Builder
from envbuild.sourcebuild.requests import build_requests, patch_sets
from envbuild.spec import LoadedSpec
from envbuild.store.core import Store, derivation_key

log = logging.getLogger("envbuild.sourcebuild.sources")


@dataclass(frozen=True)
class SourceOutcome:
    """What happened to one derivation in this build (for people; not in the manifest)."""

    kind: str  # "source-build" | "patch"
    dist: str
    version: str
    key: str
    reused: bool
    changes: list[str] = field(default_factory=list)  # inputs changed since the last build
    previous: str | None = None


@dataclass(frozen=True)
class RealizedWheel:
    """The wheel a source-build or patch layer installs, and the derivations that made it."""

    dist: str
    wheel: WheelRef
    path: Path  # its blob in the store
    sources: list[dict[str, str]]  # [{"kind": ..., "key": ...}] in the order they were applied


@dataclass
class SourcesResult:
    wheels: dict[str, RealizedWheel] = field(default_factory=dict)
    outcomes: list[SourceOutcome] = field(default_factory=list)
    builds: list[SourceBuildRecord] = field(default_factory=list)
    patches: list[PatchRecord] = field(default_factory=list)

    @property
    def keys(self) -> list[str]:
        """Every derivation key the image's root must keep alive (wheels, logs)."""
        return sorted({s["key"] for r in self.wheels.values() for s in r.sources})


def _ref(dist: str, filename: str, digest: str, store: Store) -> tuple[WheelRef, Path]:
    path = store.blob_path(digest)
    version = str(parse_wheel_filename(filename)[1])
    sha = digest.removeprefix("sha256:")
    return WheelRef(dist, version, filename, "", sha, path.stat().st_size), path


def realize_sources(
    loaded: LoadedSpec,
    lock: Lock,
    store: Store,
    builder: Callable[[], Builder],
    *,
    locked: dict[str, WheelRef],
    progress: Progress = NULL,
) -> SourcesResult:
    """Realize every source build and patch set of ``loaded``. ``builder`` makes the builder the
    first time one is needed (a builder container costs an image load); ``locked`` maps a
    distribution to its locked wheel (what an unbuilt patch applies to)."""
    result = SourcesResult()
    made: Builder | None = None
    for req in build_requests(loaded, lock):
        made = made or builder()
        with progress.task(f"source build {req.dist}", None, unit="builds"):
            built = sourcebuild.realize(req, made, store)
        wheel, path = _ref(req.dist, built.wheel, built.wheel_digest, store)
        result.wheels[req.dist] = RealizedWheel(
            req.dist, wheel, path, [{"kind": sourcebuild.KIND, "key": built.key}]
        )
        result.outcomes.append(
            SourceOutcome(
                kind=sourcebuild.KIND,
                dist=req.dist,
                version=wheel.version,
                key=built.key,
                reused=built.reused,
                changes=[c.render() for c in built.changes],
                previous=built.previous,
            )
        )
        result.builds.append(_build_record(store, built))
    for dist, files in patch_sets(loaded, lock).items():
        refs = [r for _, r in files]
        earlier = result.wheels.get(dist)
        if earlier is not None:
            base, sha, filename = earlier.path, earlier.wheel.sha256, earlier.wheel.filename
            version, prior = earlier.wheel.version, earlier.sources
        elif dist in locked:
            ref = locked[dist]
            key = derivation_key(
                patches_mod.KIND, patches_mod.patch_inputs(dist, ref.filename, ref.sha256, refs)
            )
            base = store.blob_path(f"sha256:{ref.sha256}")
            if not store.available(key):  # here, or in a remote cache
                base = fetch_wheels([ref], store, progress=progress)[ref.sha256]
            sha, filename, version, prior = ref.sha256, ref.filename, ref.version, []
        else:
            raise ManifestError(
                f"the spec patches {dist}, which the lock neither pins nor builds",
                hint="add it to the spec's packages (or [builds]) and run `envbuild lock`",
            )
        patched = patches_mod.realize_patch(
            store, dist, base, files, filename=filename, wheel_sha256=sha
        )
        p = patched.patched
        wheel, path = _ref(dist, p.wheel, patched.wheel_digest, store)
        result.wheels[dist] = RealizedWheel(
            dist, wheel, path, [*prior, {"kind": patches_mod.KIND, "key": patched.key}]
        )
        result.outcomes.append(
            SourceOutcome(patches_mod.KIND, dist, p.patched_version, patched.key, patched.reused)
        )
        result.patches.append(
            PatchRecord(
                dist=dist,
                version=version,
                patched_version=p.patched_version,
                key=patched.key,
                source_wheel={"name": filename, "sha256": sha},
                patches=[r.model_dump() for r in refs],
                files=p.files,
                wheel=p.wheel,
                wheel_sha256=wheel.sha256,
            )
        )
    return result


def _build_record(store: Store, built: sourcebuild.BuildResult) -> SourceBuildRecord:
    drv = store.lookup(built.key)
    if drv is None:  # realize() just returned it
        raise ManifestError(f"source build {built.key[:12]} vanished from the store")
    inputs = drv.inputs
    return SourceBuildRecord(
        dist=built.dist,
        version=built.version,
        key=built.key,
        sdist=dict(inputs["sdist"]),
        flags=dict(inputs["env"]),
        max_jobs=built.max_jobs,
        builder=dict(inputs["builder"]),
        toolchain={"python": inputs["python"], "compilers": dict(inputs["compilers"])},
        wheel=built.wheel,
        wheel_sha256=built.wheel_digest.removeprefix("sha256:"),
        origin=built.origin,
        audit=built.audit.model_dump(mode="json"),
        target_ccs=list(drv.meta.get("target_ccs", [])),
    )
