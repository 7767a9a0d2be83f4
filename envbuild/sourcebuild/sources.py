"""Source builds and patched wheels, realized: the one path ``envbuild build`` (before the
layers that install them) and ``envbuild apply`` (before the generation's venv) both take.

Each ``[builds]`` entry is realized by :func:`envbuild.sourcebuild.realize.realize` (a derivation
keyed by the sdist, torch, the toolchain, the flags …; built on the host or in a builder container,
see :mod:`envbuild.sourcebuild.builder`), each ``[patches]`` set by
:func:`envbuild.sourcebuild.patches.realize_patch` (keyed by the wheel's and the patches' sha256),
a patch of a source-built distribution applying to the built wheel. Every derivation is looked for
in the same order: the local store, then the remote cache in front of it (a
:class:`~envbuild.store.remote.CachedStore`), and only then built; the locked wheel a patch
applies to is fetched only when the patch is really made, so a patch found in the store or the
cache neither downloads nor hashes the (vLLM-sized) wheel it patches.

The answer, per distribution, is the wheel to install and the keys of the derivations that made
it (:class:`SourcesResult`): :func:`envbuild.build.plan.resolve_layer` turns them into a layer's
key, apply links the wheels into its generation. :func:`stored_sources` gives the same wheels
from the local store alone, building and fetching nothing (apply's preview of a generation).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from envbuild import progress
from envbuild.build.fetch import fetch_wheels
from envbuild.build.manifest import PatchRecord, SourceBuildRecord
from envbuild.errors import ManifestError
from envbuild.fsio import sha256_file
from envbuild.lock.model import Lock
from envbuild.lock.wheels import WheelRef, select_wheels
from envbuild.sourcebuild import patches as patches_mod
from envbuild.sourcebuild.builder import Builder
from envbuild.sourcebuild.inputs import build_key
from envbuild.sourcebuild.realize import BuildResult, realize
from envbuild.sourcebuild.requests import KIND as BUILD_KIND
from envbuild.sourcebuild.requests import build_requests, patch_sets
from envbuild.spec import LoadedSpec
from envbuild.store.core import Store, derivation_key

log = logging.getLogger(__name__)


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
    """Every source build and patch of a spec, realized: the wheels, what happened, the
    manifest's records."""

    wheels: dict[str, RealizedWheel] = field(default_factory=dict)
    outcomes: list[SourceOutcome] = field(default_factory=list)
    builds: list[SourceBuildRecord] = field(default_factory=list)
    patches: list[PatchRecord] = field(default_factory=list)

    @property
    def keys(self) -> list[str]:
        """Every derivation key the image's root must keep alive (wheels, logs)."""
        return sorted({s["key"] for r in self.wheels.values() for s in r.sources})


def _realized(
    dist: str, filename: str, digest: str, store: Store, sources: list[dict[str, str]]
) -> RealizedWheel:
    """The stored wheel ``digest`` (named ``filename``) as the layer or venv installs it."""
    path = store.blob_path(digest)
    version = str(parse_wheel_filename(filename)[1])
    sha = digest.removeprefix("sha256:")
    return RealizedWheel(
        dist, WheelRef(dist, version, filename, "", sha, path.stat().st_size), path, sources
    )


@dataclass(frozen=True)
class _Base:
    """The wheel a patch set applies to: the one built from source just before, or the locked
    one (in the store, or fetched when the patch is really made)."""

    filename: str
    sha256: str
    version: str
    prior: list[dict[str, str]]  # the derivations that made it (none for a locked wheel)
    path: Path | Callable[[], Path]


def _base(
    dist: str,
    made: Mapping[str, RealizedWheel],
    locked: Mapping[str, WheelRef],
    store: Store,
) -> _Base:
    if (earlier := made.get(dist)) is not None:
        w = earlier.wheel
        return _Base(w.filename, w.sha256, w.version, list(earlier.sources), earlier.path)
    if (ref := locked.get(dist)) is None:
        raise ManifestError(
            f"the spec patches {dist}, which the lock neither pins nor builds",
            hint="add it to the spec's packages (or [builds]) and run `envbuild lock`",
        )

    def fetch() -> Path:
        return fetch_wheels([ref], store)[ref.sha256]

    return _Base(ref.filename, ref.sha256, ref.version, [], fetch)


def _locked(loaded: LoadedSpec, lock: Lock) -> dict[str, WheelRef]:
    built = frozenset(canonicalize_name(d) for d in loaded.spec.builds)
    return {w.canonical: w for w in select_wheels(lock, skip=built)}


def realize_sources(
    loaded: LoadedSpec,
    lock: Lock,
    store: Store,
    builder: Callable[[], Builder],
    *,
    locked: Mapping[str, WheelRef] | None = None,
) -> SourcesResult:
    """Realize every source build and patch set of ``loaded``: each from the store, else from
    the remote cache in front of it, else built. ``builder`` makes the builder the first time
    one is needed (a builder container costs an image load); ``locked`` maps a distribution to
    its locked wheel (what a patch of a distribution not built from source applies to; default:
    the lock's wheels for the lock's target). A patch of a distribution the lock neither pins nor
    builds is a :class:`~envbuild.errors.ManifestError`."""
    result = SourcesResult()
    made: Builder | None = None
    with store.session():
        for req in build_requests(loaded, lock):
            made = made or builder()
            with progress.task(f"source build {req.dist}", None, unit="builds"):
                built = realize(req, made, store)
            realized = _realized(
                req.dist,
                built.wheel,
                built.wheel_digest,
                store,
                [{"kind": BUILD_KIND, "key": built.key}],
            )
            result.wheels[req.dist] = realized
            result.outcomes.append(
                SourceOutcome(
                    kind=BUILD_KIND,
                    dist=req.dist,
                    version=realized.wheel.version,
                    key=built.key,
                    reused=built.reused,
                    changes=[c.render() for c in built.changes],
                    previous=built.previous,
                )
            )
            result.builds.append(_build_record(store, built))
        wheels = _locked(loaded, lock) if locked is None else locked
        for dist, files in patch_sets(loaded, lock).items():
            refs = [r for _, r in files]
            base = _base(dist, result.wheels, wheels, store)
            patched = patches_mod.realize_patch(
                store, dist, base.path, files, filename=base.filename, wheel_sha256=base.sha256
            )
            p = patched.patched
            log.info("%s: patched as %s (%s)", dist, p.patched_version, p.wheel)
            realized = _realized(
                dist,
                p.wheel,
                patched.wheel_digest,
                store,
                [*base.prior, {"kind": patches_mod.KIND, "key": patched.key}],
            )
            result.wheels[dist] = realized
            result.outcomes.append(
                SourceOutcome(
                    patches_mod.KIND, dist, p.patched_version, patched.key, patched.reused
                )
            )
            result.patches.append(
                PatchRecord(
                    dist=dist,
                    version=base.version,
                    patched_version=p.patched_version,
                    key=patched.key,
                    source_wheel={"name": base.filename, "sha256": base.sha256},
                    patches=[r.model_dump() for r in refs],
                    files=p.files,
                    wheel=p.wheel,
                    wheel_sha256=realized.wheel.sha256,
                )
            )
    return result


def stored_sources(
    loaded: LoadedSpec, lock: Lock, store: Store, builder: Builder
) -> dict[str, RealizedWheel] | None:
    """The wheels :func:`realize_sources` would give, if the local store already holds every
    derivation (lookups only: nothing is built, fetched, patched or asked of a remote cache);
    else None. A patch file that is missing or not the locked one is None too (realizing says
    what is wrong with it)."""
    out: dict[str, RealizedWheel] = {}
    for req in build_requests(loaded, lock):
        toolchain = builder.probe(cuda=req.needs_cuda)
        drv = store.lookup(build_key(req, toolchain, builder))
        if drv is None:
            return None
        wheel = str(drv.meta.get("wheel", ""))
        key = {"kind": BUILD_KIND, "key": drv.key}
        out[req.dist] = _realized(req.dist, wheel, drv.outputs["wheel"], store, [key])
    locked = _locked(loaded, lock)
    for dist, files in patch_sets(loaded, lock).items():
        if any(not path.is_file() or sha256_file(path) != ref.sha256 for path, ref in files):
            return None
        try:
            base = _base(dist, out, locked, store)
        except ManifestError:
            return None
        inputs = patches_mod.patch_inputs(dist, base.filename, base.sha256, [r for _, r in files])
        drv = store.lookup(derivation_key(patches_mod.KIND, inputs))
        if drv is None:
            return None
        p = patches_mod.PatchedWheel.model_validate(drv.meta["patched"])
        sources = [*base.prior, {"kind": patches_mod.KIND, "key": drv.key}]
        out[dist] = _realized(dist, p.wheel, drv.outputs["wheel"], store, sources)
    return out


def _build_record(store: Store, built: BuildResult) -> SourceBuildRecord:
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
