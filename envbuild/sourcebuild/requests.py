"""What a spec and its lock ask to build from source and to patch.

:func:`build_requests` and :func:`patch_sets` turn ``[builds]`` and ``[patches]`` (with the lock's
sdists, torch wheel and patch digests) into the inputs of
:func:`envbuild.sourcebuild.realise.realize` and
:func:`envbuild.sourcebuild.patches.realize_patch`. :func:`describe` says what those derivations
will be
without building anything: the build plan (``envbuild build --dry-run``) and
``envbuild store plan`` show it.

A build venv holds the build requirements and the locked torch with their dependencies, pinned to
the lock: :func:`build_closure` finds those pins, and only those are a source build's
``constraints`` (an input of its key, and the build venv's ``--constraint``), so bumping a
package no build can see rebuilds nothing. The lock records no dependencies (uv's pylock.toml has
none), so they are read from the locked wheels' own METADATA (:func:`wheel_requires`).
"""

from __future__ import annotations

import logging
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from packaging.metadata import parse_email
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from pydantic import BaseModel, ConfigDict, Field

from envbuild import scratch
from envbuild.build.fetch import open_url
from envbuild.build.install import WheelRef
from envbuild.build.plan import PlannedDerivation
from envbuild.build.wheels import marker_env, select_wheels
from envbuild.errors import EnvironmentFailure, IntegrityError, ManifestError, UsageError
from envbuild.fsio import atomic_writer, sha256_file
from envbuild.lock.model import Lock
from envbuild.sourcebuild.audit import Audit
from envbuild.sourcebuild.builder import Builder, HostBuilder
from envbuild.sourcebuild.patches import KIND as PATCH_KIND
from envbuild.sourcebuild.patches import PatchRef, patch_inputs, patched_version
from envbuild.sourcebuild.realise import (
    EXTRA_REQUIRES,
    BuildResult,
    FileRef,
    JobsPlan,
    SourceBuildRequest,
    TorchRef,
    add_wheel,
    check_archs,
    check_wheel_file,
    inputs_of,
    plan_jobs,
)
from envbuild.sourcebuild.realise import KIND as BUILD_KIND
from envbuild.sourcebuild.toolchain import Nvcc, requested_archs
from envbuild.spec.knowledge import gpu as known_gpu
from envbuild.spec.load import LoadedSpec
from envbuild.store.core import Store, derivation_key

log = logging.getLogger("envbuild.sourcebuild.requests")

#: Reads a locked wheel's ``Requires-Dist`` (:func:`wheel_requires`; tests pass their own).
RequiresOf = Callable[[WheelRef], list[str]]


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


def build_requests(
    loaded: LoadedSpec, lock: Lock, *, requires_of: RequiresOf | None = None
) -> list[SourceBuildRequest]:
    """One request per ``[builds]`` entry, in name order. Each one's ``constraints`` are the
    lock's pins of what its build venv installs (:func:`build_closure`); ``requires_of`` reads
    a locked wheel's dependencies (default: what the lock recorded at lock time, else
    :func:`wheel_requires`)."""
    return _requests(loaded, lock, requires_of or locked_requires(lock))


def locked_requires(lock: Lock) -> RequiresOf:
    """A wheel's ``Requires-Dist`` as the lock recorded it (format 3), so keying a source build
    needs no index; from the wheel's METADATA (:func:`wheel_requires`) when it recorded none."""
    recorded = lock.envbuild.requires

    def read(wheel: WheelRef) -> list[str]:
        found = recorded.get(wheel.sha256)
        return list(found) if found is not None else wheel_requires(wheel)

    return read


def _requests(
    loaded: LoadedSpec, lock: Lock, requires_of: RequiresOf | None
) -> list[SourceBuildRequest]:
    """The requests; without ``requires_of`` (a plan) their constraints are left empty."""
    meta = lock.envbuild
    torch = _torch(lock)
    indexes = {i.name: i.url for i in meta.indexes}
    read = _memo(requires_of) if requires_of else None
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
                constraints=build_closure(lock, build_roots(dist, torch), read) if read else [],
                index_url=indexes.get("default"),
                extra_index_urls=[u for n, u in sorted(indexes.items()) if n != "default"],
                exclude_newer=meta.exclude_newer.isoformat().replace("+00:00", "Z"),
                target_ccs=target_ccs(loaded),
                where=f"{file}:{line}" if line else file,
                python=meta.python,
                platform=meta.platform,
            )
        )
    return out


# --- what a build venv sees -------------------------------------------------------------------


def build_roots(dist: str, torch: TorchRef | None) -> list[str]:
    """What a build venv is asked to install before the sdist's own ``[build-system]
    requires`` are known: envbuild's extra build requirements and the locked torch."""
    roots = list(EXTRA_REQUIRES.get(canonicalize_name(dist), []))
    return [*roots, "torch"] if torch else roots


def build_closure(lock: Lock, roots: Sequence[str], requires_of: RequiresOf) -> list[str]:
    """The lock's pins (``name==version ; marker``) of ``roots`` and everything they depend on,
    sorted: the locked packages a build venv holding ``roots`` installs, and so the only ones a
    build can see. Dependencies come from each locked wheel's ``Requires-Dist`` (the lock does
    not record them), markers evaluated for the lock's target; a name the lock does not hold is
    not followed (uv resolves it at build time, under the lock's exclude-newer)."""
    if not roots:
        return []
    built = frozenset(canonicalize_name(b.name) for b in lock.envbuild.builds)
    wheels = {w.canonical: w for w in select_wheels(lock, skip=built)}
    env = marker_env(lock.envbuild.python, lock.envbuild.platform)
    seen: set[tuple[str, str]] = set()
    todo = [(_requirement(r, "the build requirements"), "") for r in roots]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({**env, "extra": extra}):
            continue
        name = canonicalize_name(req.name)
        for wanted in ("", *sorted(req.extras)):
            if (name, wanted) in seen or name not in wheels:
                continue
            seen.add((name, wanted))
            wheel = wheels[name]
            todo += [(_requirement(r, wheel.filename), wanted) for r in requires_of(wheel)]
    names = {n for n, _ in seen}
    return sorted(
        f"{p.name}=={p.version}" + (f" ; {p.marker}" if p.marker else "")
        for p in lock.packages
        if canonicalize_name(p.name) in names
    )


def wheel_requires(wheel: WheelRef) -> list[str]:
    """A locked wheel's ``Requires-Dist``, from its own METADATA: PEP 658's ``<url>.metadata``
    when the index serves it, else the wheel itself (a ``file://`` URL, or downloaded), checked
    against the lock's sha256 first. What came from an index is kept by the wheel's sha256 in
    ``$XDG_CACHE_HOME/envbuild/wheel-metadata`` (a wheel's metadata never changes), so it is
    read once per machine."""
    url = urllib.parse.urlparse(wheel.url)
    if url.scheme in ("file", ""):
        return _requires(_zip_metadata(Path(urllib.request.url2pathname(url.path)), wheel), wheel)
    cache = (
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        / "envbuild"
        / "wheel-metadata"
        / f"{wheel.sha256}.metadata"
    )
    if cache.is_file():
        return _requires(cache.read_bytes(), wheel)
    data = _http(wheel.url + ".metadata", wheel, optional=True)
    if data is None:
        log.info("%s: the index serves no METADATA file; reading the wheel", wheel.filename)
        with scratch.temp_dir("wheel-") as tmp:
            path = Path(tmp) / wheel.filename
            _http(wheel.url, wheel, into=path)
            data = _zip_metadata(path, wheel)
    with atomic_writer(cache) as f:
        f.write(data)
    return _requires(data, wheel)


def _http(
    url: str, wheel: WheelRef, *, optional: bool = False, into: Path | None = None
) -> bytes | None:
    """``url``'s body (streamed ``into`` a file when given: a wheel can be gigabytes); None for
    an ``optional`` file the index does not have."""
    try:
        with open_url(url, timeout=120) as response:
            if into is None:
                data: bytes = response.read()
                return data
            with into.open("wb") as f:
                shutil.copyfileobj(response, f, 1 << 20)
            return b""
    except urllib.error.HTTPError as exc:
        if optional and 400 <= exc.code < 500:
            return None
        reason: object = f"HTTP {exc.code} {exc.reason}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
    raise EnvironmentFailure(
        f"cannot read the dependencies of {wheel.filename} from {url}: {reason}",
        hint="a source build's key holds the locked packages its build venv installs, found from "
        "the locked wheels' METADATA; check the network (proxy, $SSL_CERT_FILE) and rerun",
    )


def _zip_metadata(path: Path, wheel: WheelRef) -> bytes:
    if sha256_file(path) != wheel.sha256:
        raise IntegrityError(
            f"{wheel.filename}: sha256 {sha256_file(path)}, the lock promises {wheel.sha256}",
            hint="the index serves other bytes than when the lock was made; relock",
        )
    name = canonicalize_name(wheel.name)
    try:
        with zipfile.ZipFile(path) as zf:
            member = next(
                (
                    n
                    for n in zf.namelist()
                    if n.count("/") == 1
                    and n.endswith(".dist-info/METADATA")
                    and canonicalize_name(n.split("-", 1)[0]) == name
                ),
                None,
            )
            if member is None:
                raise EnvironmentFailure(f"{wheel.filename} has no .dist-info/METADATA")
            return zf.read(member)
    except (zipfile.BadZipFile, OSError) as exc:
        raise EnvironmentFailure(f"{wheel.filename} is not a readable wheel: {exc}") from None


def _requires(data: bytes, wheel: WheelRef) -> list[str]:
    raw, _ = parse_email(data)
    return [str(r) for r in raw.get("requires_dist", [])]


def _requirement(text: str, whose: str) -> Requirement:
    try:
        return Requirement(text)
    except InvalidRequirement as exc:
        raise ManifestError(f"{whose}: bad requirement {text!r}: {exc}") from None


def _memo(read: RequiresOf) -> RequiresOf:
    done: dict[str, list[str]] = {}

    def get(wheel: WheelRef) -> list[str]:
        if wheel.sha256 not in done:
            done[wheel.sha256] = read(wheel)
        return done[wheel.sha256]

    return get


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
    from envbuild.lock import find_lock, read_lock
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


# --- what a build will cost, and whether it is needed -------------------------------------------


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


STATE_TEXT = {
    "cached": "cached here",
    "remote": "in the remote cache",
    "build": "to be built",
}


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
    and MAX_JOBS with its memory estimate (:func:`envbuild.sourcebuild.realise.plan_jobs`). Builds
    nothing."""
    spec_cuda = loaded.spec.cuda.version if loaded.spec.cuda else None
    out = []
    for req in build_requests(loaded, lock, requires_of=requires_of):
        jobs = plan_jobs(req, memory=memory, cores=cores)
        toolchain = builder.probe(cuda=req.needs_cuda)
        check_archs(req, toolchain)
        inputs = inputs_of(req, toolchain, builder)
        key = derivation_key(BUILD_KIND, inputs)
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
