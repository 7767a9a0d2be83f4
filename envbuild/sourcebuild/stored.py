"""A spec's source builds against the store: what ``envbuild store plan``, ``ls`` and
``add-wheel`` show and do.

:func:`store_plan_for_spec` gives what the spec derives
(:func:`envbuild.sourcebuild.requests.describe`) and, per source build, its cost here
(:func:`build_costs`: the key ``realize`` would compute, whether this store or its remote cache
has it, the nvcc it would run, ``MAX_JOBS`` and its memory estimate). :func:`stored_outputs`
lists every source build and patched wheel the store holds; :func:`add_wheel_for_spec` records a
wheel built elsewhere as a spec's build. Nothing is built.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from packaging.utils import canonicalize_name
from pydantic import BaseModel, ConfigDict, Field

from envbuild.build.plan import PlannedDerivation
from envbuild.errors import UsageError
from envbuild.lock.closure import RequiresOf
from envbuild.lock.model import Lock
from envbuild.sourcebuild.audit import Audit
from envbuild.sourcebuild.builder import Builder, HostBuilder
from envbuild.sourcebuild.checks import check_archs, check_wheel_file
from envbuild.sourcebuild.inputs import build_key
from envbuild.sourcebuild.jobs import JobsPlan, plan_jobs
from envbuild.sourcebuild.patches import KIND as PATCH_KIND
from envbuild.sourcebuild.realize import BuildResult, add_wheel
from envbuild.sourcebuild.requests import KIND as BUILD_KIND
from envbuild.sourcebuild.requests import build_requests, describe
from envbuild.sourcebuild.toolchain import Nvcc
from envbuild.spec.load import LoadedSpec
from envbuild.store.core import Store

log = logging.getLogger(__name__)

STATE_TEXT = {
    "cached": "cached here",
    "remote": "in the remote cache",
    "build": "to be built",
}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StoredOutput(_Model):
    """A source build or patched wheel the store holds (``envbuild store ls``)."""

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
    from envbuild.lock.core import find_lock
    from envbuild.lock.io import read_lock
    from envbuild.spec.load import load_spec

    loaded = load_spec(spec)
    return loaded, read_lock(find_lock(loaded))


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
    check_wheel_file(req, wheel)  # before the builder: a builder container costs an image
    made = builder(loaded) if builder else HostBuilder(loaded.spec.python.version)
    return add_wheel(req, made, store, wheel, checked=True)


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


class NvccFound(_Model):
    """The nvcc a source build would run, and whether its CUDA is the spec's."""

    path: str
    version: str = Field(description="nvcc's full version, e.g. 13.0.88")
    cuda: str = Field(description="its CUDA release, MAJOR.MINOR")
    spec_cuda: str | None = Field(None, description="the spec's cuda.version")
    warning: str | None = None


class BuildCost(_Model):
    """``envbuild store plan`` for one source build: its key, whether it must be built, the
    toolchain it would use and the memory it will take."""

    dist: str
    version: str
    key: str
    state: Literal["cached", "remote", "build"] = Field(
        description="cached: in this store; remote: in the remote cache; build: to be built"
    )
    builder: dict[str, str]
    python: str
    compilers: dict[str, str]
    nvcc: NvccFound | None = None
    memory: JobsPlan
    warnings: list[str] = Field(default_factory=list)


def nvcc_found(nvcc: Nvcc, spec_cuda: str | None) -> NvccFound:
    """``nvcc`` as the plan shows it; a warning when its CUDA release is not the spec's
    ``cuda.version`` (the key names the nvcc that runs, so the wheel is not the one the spec's
    toolkit would make)."""
    warning = None
    if spec_cuda and nvcc.release != ".".join(spec_cuda.split(".")[:2]):
        warning = (
            f"nvcc {nvcc.version} at {nvcc.path} is CUDA {nvcc.release}, but the spec's "
            f"cuda.version is {spec_cuda}: the build runs with this nvcc (its version is in the "
            f"key), not the spec's toolkit; point ENVBUILD_NVCC (or CUDA_HOME) at a CUDA "
            f"{spec_cuda} nvcc, e.g. `pip install nvidia-cuda-nvcc=={spec_cuda}.*` with its "
            "crt, nvvm, runtime and cccl wheels"
        )
    return NvccFound(
        path=nvcc.path, version=nvcc.version, cuda=nvcc.release, spec_cuda=spec_cuda,
        warning=warning,
    )  # fmt: skip


def state_of(store: Store, key: str) -> Literal["cached", "remote", "build"]:
    """Where derivation ``key`` would come from: this store, its remote cache, or a build."""
    if store.lookup(key) is not None:
        return "cached"
    return "remote" if store.available(key) else "build"


def build_costs(
    loaded: LoadedSpec,
    lock: Lock,
    store: Store,
    builder: Builder,
    *,
    memory: int | None = None,
    cores: int | None = None,
    requires_of: RequiresOf | None = None,
) -> list[BuildCost]:
    """Each source build's key (as ``realize`` computes it: the build venv's locked pins, the
    builder's toolchain), whether the store or its remote cache has it, the nvcc it would run
    and MAX_JOBS with its memory estimate (:func:`envbuild.sourcebuild.jobs.plan_jobs`). Builds
    nothing."""
    spec_cuda = loaded.spec.cuda.version if loaded.spec.cuda else None
    out = []
    for req in build_requests(loaded, lock, requires_of=requires_of):
        jobs = plan_jobs(req, memory=memory, cores=cores)
        toolchain = builder.probe(cuda=req.needs_cuda)
        check_archs(req, toolchain)
        key = build_key(req, toolchain, builder)
        nvcc = nvcc_found(toolchain.nvcc, spec_cuda) if toolchain.nvcc else None
        warnings = [w for w in (nvcc.warning if nvcc else None, jobs.warning()) if w]
        out.append(
            BuildCost(
                dist=req.dist,
                version=req.version,
                key=key,
                state=state_of(store, key),
                builder=builder.identity(),
                python=toolchain.python,
                compilers=toolchain.compilers,
                nvcc=nvcc,
                memory=jobs,
                warnings=warnings,
            )
        )
    return out


def store_plan_for_spec(
    spec: Path,
    store: Store,
    *,
    builder: Callable[[LoadedSpec], Builder] | None = None,
    memory: int | None = None,
) -> tuple[list[PlannedDerivation], list[BuildCost]]:
    """``envbuild store plan``: what the spec derives (:func:`describe`) and, for each source
    build, what it will cost here (:func:`build_costs`, on ``builder(loaded)``, default this
    host)."""
    loaded, lock = _loaded_and_lock(spec)
    planned = describe(loaded, lock)
    if not loaded.spec.builds:
        return planned, []
    made = builder(loaded) if builder else HostBuilder(loaded.spec.python.version)
    return planned, build_costs(loaded, lock, store, made, memory=memory)
