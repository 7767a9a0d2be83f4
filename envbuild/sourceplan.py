"""What a spec and its lock ask to build from source and to patch.

:func:`build_requests` and :func:`patch_sets` turn ``[builds]`` and ``[patches]`` (with the lock's
sdists, torch wheel and patch digests) into the inputs of :func:`envbuild.sourcebuild.realize` and
:func:`envbuild.patches.realize_patch`. :func:`describe` says what those derivations will be
without building anything: the build plan (``envbuild build --dry-run``) and
``envbuild store plan`` show it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from packaging.utils import canonicalize_name
from pydantic import BaseModel, ConfigDict, Field

from envbuild.audit import Audit
from envbuild.builder import Builder, HostBuilder
from envbuild.errors import ManifestError, UsageError
from envbuild.lock.model import Lock
from envbuild.patches import KIND as PATCH_KIND
from envbuild.patches import PatchRef, patch_inputs, patched_version
from envbuild.plan import PlannedDerivation, select_wheels
from envbuild.sourcebuild import (
    EXTRA_REQUIRES,
    BuildResult,
    FileRef,
    SourceBuildRequest,
    TorchRef,
    add_wheel,
)
from envbuild.sourcebuild import KIND as BUILD_KIND
from envbuild.spec.knowledge import gpu as known_gpu
from envbuild.spec.load import LoadedSpec
from envbuild.store import Store, derivation_key
from envbuild.toolchain import requested_archs


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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


def build_requests(loaded: LoadedSpec, lock: Lock) -> list[SourceBuildRequest]:
    """One request per ``[builds]`` entry, in name order."""
    meta = lock.envbuild
    torch = _torch(lock)
    indexes = {i.name: i.url for i in meta.indexes}
    constraints = sorted(
        f"{p.name}=={p.version}" + (f" ; {p.marker}" if p.marker else "") for p in lock.packages
    )
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
                constraints=constraints,
                index_url=indexes.get("default"),
                extra_index_urls=[u for n, u in sorted(indexes.items()) if n != "default"],
                exclude_newer=meta.exclude_newer.isoformat().replace("+00:00", "Z"),
                target_ccs=target_ccs(loaded),
                where=f"{file}:{line}" if line else file,
            )
        )
    return out


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
    for req in build_requests(loaded, lock):
        env = req.build_env
        archs = ", ".join(sorted({r.arch.sass for r in requested_archs(env)})) or "none"
        flags = " ".join(f"{k}={v}" for k, v in sorted(env.items()))
        jobs = "" if env.get("MAX_JOBS") else " (MAX_JOBS chosen from free memory at build time)"
        out.append(
            PlannedDerivation(
                kind=BUILD_KIND,
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


# --- what the CLI calls -----------------------------------------------------------------------


class StoredOutput(_Model):
    key: str
    kind: str
    dist: str
    version: str
    wheel: str
    origin: str
    wheel_digest: str
    log_digest: str | None = None
    builder: str = Field("", description="where a source build ran: host or container")
    sass: list[str] = Field(default_factory=list)
    ptx: list[str] = Field(default_factory=list)


def _loaded_and_lock(spec: Path) -> tuple[LoadedSpec, Lock]:
    from envbuild.lock import lock_path, read_lock
    from envbuild.spec.load import load_spec

    loaded = load_spec(spec)
    return loaded, read_lock(lock_path(loaded))


def plan_for_spec(spec: Path) -> list[PlannedDerivation]:
    """``envbuild store plan``: the spec's source builds and patches."""
    return describe(*_loaded_and_lock(spec))


def add_wheel_for_spec(
    spec: Path,
    dist: str,
    wheel: Path,
    store: Store,
    *,
    builder: Callable[[LoadedSpec], Builder] | None = None,
) -> BuildResult:
    """``envbuild store add-wheel``: record ``wheel`` as the build of ``dist`` for ``spec``, under
    the key a build by ``builder(loaded)`` would have (default: on this host)."""
    loaded, lock = _loaded_and_lock(spec)
    wanted = canonicalize_name(dist)
    req = next((r for r in build_requests(loaded, lock) if r.dist == wanted), None)
    if req is None:
        raise UsageError(
            f"{loaded.display(loaded.path)} builds no {dist} from source",
            hint=f"it builds: {', '.join(sorted(loaded.spec.builds)) or 'nothing'}",
        )
    made = builder(loaded) if builder else HostBuilder(loaded.spec.python.version)
    return add_wheel(req, made, store, wheel)


def stored_outputs(store: Store) -> list[StoredOutput]:
    """Every source build and patched wheel the store holds, by distribution."""
    out = []
    for key in store.derivations():
        drv = store.lookup(key)
        if drv is None or drv.kind not in (BUILD_KIND, PATCH_KIND):
            continue
        if drv.kind == BUILD_KIND:
            audit = Audit.model_validate(drv.meta.get("audit", {}))
            wheel, origin = str(drv.meta.get("wheel")), str(drv.meta.get("origin"))
            version = str(drv.inputs.get("version", ""))
            sass, ptx = audit.sass, audit.ptx
        else:
            patched = drv.meta.get("patched", {})
            wheel, origin = str(patched.get("wheel")), "patched"
            version, sass, ptx = str(patched.get("patched_version")), [], []
        out.append(
            StoredOutput(
                key=key,
                kind=drv.kind,
                dist=str(drv.inputs.get("dist")),
                version=version,
                wheel=wheel,
                origin=origin,
                wheel_digest=drv.outputs["wheel"],
                log_digest=drv.outputs.get("log"),
                builder=str(dict(drv.inputs.get("builder") or {}).get("mode", "")),
                sass=sass,
                ptx=ptx,
            )
        )
    return sorted(out, key=lambda o: (o.dist, o.kind, o.version, o.key))
