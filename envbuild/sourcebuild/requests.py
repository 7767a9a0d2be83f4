"""What a spec and its lock ask to build from source and to patch.

:func:`build_requests` turns each ``[builds]`` entry, with the lock's sdist, torch wheel and
target, into a :class:`SourceBuildRequest` (the input of
:func:`envbuild.sourcebuild.realize.realize`); :func:`patch_sets` turns ``[patches]``, with the
lock's patch digests, into the input of :func:`envbuild.sourcebuild.patches.realize_patch`.
A request's ``constraints`` are the build venv's locked pins
(:mod:`envbuild.lock.closure`). :func:`describe` says what those derivations will be
without building or reading anything: the build plan (``envbuild build --dry-run``) and
``envbuild store plan`` show it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from packaging.utils import canonicalize_name
from pydantic import BaseModel, ConfigDict, Field

from envbuild.build.plan import PlannedDerivation
from envbuild.errors import ManifestError
from envbuild.lock.closure import EXTRA_REQUIRES, RequiresOf, closures, locked_requires
from envbuild.lock.model import Lock
from envbuild.lock.wheels import select_wheels
from envbuild.sourcebuild.patches import KIND as PATCH_KIND
from envbuild.sourcebuild.patches import PatchRef, patch_inputs, patched_version
from envbuild.sourcebuild.toolchain import requested_archs
from envbuild.spec.knowledge import gpu as known_gpu
from envbuild.spec.load import LoadedSpec
from envbuild.store.core import derivation_key

log = logging.getLogger(__name__)

KIND = "source-build"
#: Flags envbuild sets whatever the spec says: flash-attn's setup.py otherwise downloads a
#: prebuilt wheel from GitHub when one matches, silently.
FORCED_ENV: dict[str, dict[str, str]] = {"flash-attn": {"FLASH_ATTENTION_FORCE_BUILD": "TRUE"}}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FileRef(_Model):
    """A locked file: the sdist a build starts from."""

    name: str = Field(description="file name")
    url: str
    sha256: str
    size: int | None = None


class TorchRef(_Model):
    """The locked torch wheel a build compiles against."""

    version: str
    wheel: str
    sha256: str


class SourceBuildRequest(_Model):
    """Everything about one source build that the spec and lock decide."""

    dist: str
    version: str
    sdist: FileRef
    env: dict[str, str] = Field(default_factory=dict, description="declared flags")
    torch: TorchRef | None = None
    requires: list[str] = Field(default_factory=list, description="extra build requirements")
    constraints: list[str] = Field(
        default_factory=list,
        description="the locked pins the build venv can see: the lock's packages in the "
        "dependency closure of the build requirements and torch (name==version ; marker)",
    )
    index_url: str | None = None
    extra_index_urls: list[str] = Field(default_factory=list)
    exclude_newer: str | None = None
    target_ccs: list[str] = Field(default_factory=list, description="the GPUs' capabilities")
    where: str | None = Field(None, description="the spec file and line declaring the build")
    python: str | None = Field(None, description="the target's Python, MAJOR.MINOR (the lock's)")
    platform: str | None = Field(None, description="the target's platform tag (the lock's)")

    @property
    def build_env(self) -> dict[str, str]:
        return {**self.env, **FORCED_ENV.get(canonicalize_name(self.dist), {})}

    @property
    def needs_cuda(self) -> bool:
        return bool(requested_archs(self.build_env)) or self.torch is not None


def target_ccs(loaded: LoadedSpec) -> list[str]:
    """The compute capabilities of the spec's GPUs (from the knowledge base when not written)."""
    host = loaded.spec.host
    ccs = set(loaded.spec.gpu_ccs())
    for g in host.gpus if host else []:
        if g.compute_capability is None and (fact := known_gpu(g.model)):
            ccs.add(fact.compute_capability)
    return sorted(ccs, key=lambda c: tuple(int(p) for p in c.split(".")))


def _torch(lock: Lock) -> TorchRef | None:
    if lock.package("torch") is None:
        return None
    built = frozenset(canonicalize_name(b.name) for b in lock.envbuild.builds)
    ref = next(w for w in select_wheels(lock, skip=built) if w.canonical == "torch")
    return TorchRef(version=ref.version, wheel=ref.filename, sha256=ref.sha256)


def build_requests(
    loaded: LoadedSpec, lock: Lock, *, requires_of: RequiresOf | None = None
) -> list[SourceBuildRequest]:
    """One request per ``[builds]`` entry, in name order. Each one's ``constraints`` are the
    lock's pins of what its build venv installs
    (:func:`envbuild.lock.closure.build_closure`); ``requires_of`` reads a locked wheel's
    dependencies (default: what the lock recorded at lock time, else
    :func:`envbuild.lock.closure.wheel_requires`)."""
    return _requests(loaded, lock, requires_of or locked_requires(lock))


def _requests(
    loaded: LoadedSpec, lock: Lock, requires_of: RequiresOf | None
) -> list[SourceBuildRequest]:
    """The requests; without ``requires_of`` (a plan) their constraints are left empty."""
    meta = lock.envbuild
    torch = _torch(lock)
    indexes = {i.name: i.url for i in meta.indexes}
    out = []
    for dist in sorted(loaded.spec.builds):
        locked = lock.build(dist)
        if locked is None:
            raise ManifestError(
                f"the lock of {loaded.name} has no source build of {dist}",
                hint="the lock is older than the spec; run `envbuild lock`",
            )
        file, line = loaded.where(("builds", dist))
        out.append(
            SourceBuildRequest(
                dist=canonicalize_name(dist),
                version=locked.version,
                sdist=FileRef(
                    name=locked.sdist.name,
                    url=locked.sdist.url,
                    sha256=locked.sdist.hashes.sha256,
                    size=locked.sdist.size,
                ),
                env=dict(loaded.spec.builds[dist].env),
                torch=torch,
                index_url=indexes.get("default"),
                extra_index_urls=[u for n, u in sorted(indexes.items()) if n != "default"],
                exclude_newer=meta.exclude_newer.isoformat().replace("+00:00", "Z"),
                target_ccs=target_ccs(loaded),
                where=f"{file}:{line}" if line else file,
                python=meta.python,
                platform=meta.platform,
            )
        )
    if requires_of is None:
        return out
    pins = closures(lock, [r.dist for r in out], requires_of)
    return [r.model_copy(update={"constraints": pins[r.dist]}) for r in out]


def patch_sets(loaded: LoadedSpec, lock: Lock) -> dict[str, list[tuple[Path, PatchRef]]]:
    """``{dist: [(patch file, its locked ref)]}`` in the spec's order."""
    out: dict[str, list[tuple[Path, PatchRef]]] = {}
    for dist in sorted(loaded.spec.patches):
        name = canonicalize_name(dist)
        locked = lock.envbuild.patches.get(name) or lock.envbuild.patches.get(dist)
        if locked is None:
            raise ManifestError(
                f"the lock of {loaded.name} has no patches for {dist}",
                hint="the lock is older than the spec; run `envbuild lock`",
            )
        out[name] = [(loaded.root / p.path, PatchRef(path=p.path, sha256=p.sha256)) for p in locked]
    return out


def describe(loaded: LoadedSpec, lock: Lock) -> list[PlannedDerivation]:
    """The source builds and patches of a spec, before any is built."""
    out: list[PlannedDerivation] = []
    for req in _requests(loaded, lock, None):  # no constraints: a plan reads no wheel
        env = req.build_env
        archs = ", ".join(sorted({r.arch.sass for r in requested_archs(env)})) or "none"
        flags = " ".join(f"{k}={v}" for k, v in sorted(env.items()))
        jobs = "" if env.get("MAX_JOBS") else " (MAX_JOBS chosen from free memory at build time)"
        out.append(
            PlannedDerivation(
                kind=KIND,
                dist=req.dist,
                version=req.version,
                summary=f"build {req.dist} {req.version} from {req.sdist.name} with {flags}; "
                f"archs {archs}; audit for GPUs {', '.join(req.target_ccs) or 'none'}{jobs}",
                inputs={
                    "sdist": req.sdist.model_dump(exclude_none=True),
                    "env": env,
                    "torch": req.torch.model_dump() if req.torch else None,
                    "requires": sorted(EXTRA_REQUIRES.get(req.dist, [])),
                    "target_ccs": req.target_ccs,
                },
            )
        )
    built = {canonicalize_name(d) for d in loaded.spec.builds}
    wheels = {w.canonical: w for w in select_wheels(lock, skip=frozenset(built))}
    for dist, patches in patch_sets(loaded, lock).items():
        refs = [r for _, r in patches]
        names = ", ".join(f"{r.path} (sha256 {r.sha256[:12]})" for r in refs)
        wheel = wheels.get(dist)
        key = version = None
        if wheel is not None:
            key = derivation_key(PATCH_KIND, patch_inputs(dist, wheel.filename, wheel.sha256, refs))
            version = patched_version(wheel.version, key)
        source = wheel.filename if wheel else "the source-built wheel"
        out.append(
            PlannedDerivation(
                kind=PATCH_KIND,
                dist=dist,
                version=wheel.version if wheel else "",
                summary=f"patch {source} with {names}"
                + (f" -> {dist} {version}" if version else ""),
                inputs={
                    "wheel": {"name": wheel.filename, "sha256": wheel.sha256} if wheel else None,
                    "patches": [r.model_dump() for r in refs],
                },
                key=key,
                patched_version=version,
            )
        )
    return out
