"""Source builds as derivations: a wheel built once per input set, audited for its GPU archs.

:func:`realize` computes the build's key (:func:`envbuild.sourcebuild.inputs.inputs_of`) and
looks for it in the store, then in the remote cache in front of it, and only then builds: the
sdist fetched and patched (:mod:`envbuild.sourcebuild.sdist`), the wheel made by a
:class:`~envbuild.sourcebuild.builder.Builder` (on the host or in a builder container) with
``MAX_JOBS`` from :mod:`envbuild.sourcebuild.jobs`, then audited
(:mod:`envbuild.sourcebuild.audit`). The output is the wheel and the build log, both blobs in the
store; the record keeps the audit of every compiled file of the wheel.

Same inputs: the stored wheel is reused. Changed inputs: it is built again, and the result says
which inputs changed since the last build of that distribution. A build that fails, is killed
for memory, or whose audit lacks a target GPU's compute capability leaves the store as it was
(:class:`BuildFailed` carries the log's tail; the whole log is kept outside the store).
:func:`add_wheel` records a wheel built elsewhere under the key a build here would have.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from pydantic import BaseModel, ConfigDict, Field

from envbuild import scratch
from envbuild.errors import (
    BuildFailed,
)
from envbuild.sourcebuild.audit import Audit, audit_wheel
from envbuild.sourcebuild.builder import (
    Builder,
    BuildJob,
    BuildOutcome,
    unsupported_arch,
    was_killed,
)
from envbuild.sourcebuild.checks import (
    check_archs,
    check_audit,
    check_wheel_file,
    check_wheel_name,
    int_flags,
)
from envbuild.sourcebuild.inputs import (
    InputChange,
    SdistPatch,
    diff_inputs,
    inputs_of,
    previous_build,
)
from envbuild.sourcebuild.jobs import plan_jobs
from envbuild.sourcebuild.requests import KIND, SourceBuildRequest
from envbuild.sourcebuild.sdist import build_system_requires, fetch_sdist, patch_sdist
from envbuild.store.core import Derivation, Output, Store, derivation_key

log = logging.getLogger(__name__)

LOG_TAIL = 40


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BuildResult(_Model):
    """One realized source build: its key, whether it was reused, the stored wheel and log, the
    audit, and what changed since the last build of the distribution."""

    dist: str
    version: str
    key: str
    reused: bool
    wheel: str = Field(description="the wheel's file name")
    wheel_digest: str
    log_digest: str | None
    audit: Audit
    max_jobs: int | None = None
    changes: list[InputChange] = Field(default_factory=list)
    previous: str | None = Field(None, description="key of the last build of this distribution")
    origin: str = Field("built", description="'built' here or 'added' by store add-wheel")


def realize(
    req: SourceBuildRequest,
    builder: Builder,
    store: Store,
    *,
    memory: int | None = None,
) -> BuildResult:
    """The wheel for ``req``: from the store when its inputs were built before, else built."""
    int_flags(req)
    toolchain = builder.probe(cuda=req.needs_cuda)
    check_archs(req, toolchain)
    inputs = inputs_of(req, toolchain, builder)
    key = derivation_key(KIND, inputs)
    with store.session():
        found = store.lookup(key)
        if found is not None:
            result = _result(req, found, reused=True)
            check_audit(req, result.audit, result.wheel)
            log.info("%s %s: reusing the build %s", req.dist, req.version, key[:12])
            return result
        if store.available(key):  # a store with a remote cache in front has it there
            log.info("%s %s: the build %s is in the cache", req.dist, req.version, key[:12])
            substituted = store.realize(
                KIND, inputs, lambda: _build(req, builder, store, inputs, memory=memory)
            )
            result = _result(req, substituted.drv, reused=substituted.reused)
            check_audit(req, result.audit, result.wheel)
            return result
        prev = previous_build(store, req.dist, not_key=key)
        changes = diff_inputs(prev.inputs, inputs) if prev else []
        if prev:
            log.info(
                "%s %s: inputs changed since build %s, building again: %s",
                req.dist,
                req.version,
                prev.key[:12],
                "; ".join(c.render() for c in changes),
            )
        else:
            log.info("%s %s: no earlier build, building", req.dist, req.version)

        def run() -> Output:
            return _build(req, builder, store, inputs, memory=memory)

        realized = store.realize(KIND, inputs, run)
        return _result(
            req,
            realized.drv,
            reused=realized.reused,
            changes=changes,
            previous=prev.key if prev else None,
        )


def _build(
    req: SourceBuildRequest,
    builder: Builder,
    store: Store,
    inputs: dict[str, Any],
    *,
    memory: int | None,
) -> Output:
    max_jobs = plan_jobs(req, memory=memory).warn().max_jobs
    env = {**req.build_env, "MAX_JOBS": str(max_jobs)}
    with store.temp_dir(prefix="build-") as work:
        (work / "out").mkdir()
        sdist = fetch_sdist(req.sdist, work)
        patches = [SdistPatch.model_validate(p) for p in inputs.get("source_patches", [])]
        if patches:
            log.info(
                "%s %s: patching the sdist: %s",
                req.dist,
                req.version,
                ", ".join(p.name for p in patches),
            )
        sdist = patch_sdist(sdist, patches, work)
        requires = sorted({*inputs["requires"], *build_system_requires(sdist)})
        if req.torch:
            requires.append(f"torch=={req.torch.version}")
        job = BuildJob(
            dist=req.dist,
            version=req.version,
            sdist=sdist,
            env=env,
            requires=requires,
            constraints=req.constraints,
            index_url=req.index_url,
            extra_index_urls=req.extra_index_urls,
            exclude_newer=req.exclude_newer,
            out_dir=work / "out",
            work_dir=work,
        )
        outcome = builder.build(job)
        if outcome.wheel is None:
            raise _failure(req, outcome, max_jobs, _keep_log(req, outcome, inputs))
        check_wheel_name(req, outcome.wheel.name)
        audit = audit_wheel(outcome.wheel)
        log.info("%s %s: audit: %s", req.dist, req.version, audit.summary())
        check_audit(req, audit, outcome.wheel.name)
        log_path = work / "build.log"
        log_path.write_text(outcome.log, encoding="utf-8")
        wheel_digest = store.add_file(outcome.wheel)
        log_digest = store.add_file(log_path)
        return Output(
            outputs={"wheel": wheel_digest, "log": log_digest},
            meta=_meta(req, outcome.wheel.name, audit, max_jobs, origin="built"),
        )


def _meta(
    req: SourceBuildRequest, wheel: str, audit: Audit, max_jobs: int | None, *, origin: str
) -> dict[str, Any]:
    return {
        "wheel": wheel,
        "sdist_url": req.sdist.url,
        "audit": audit.model_dump(),
        "target_ccs": req.target_ccs,
        "max_jobs": max_jobs,
        "origin": origin,
    }


def _keep_log(req: SourceBuildRequest, outcome: BuildOutcome, inputs: dict[str, Any]) -> Path:
    """A failed build's whole log, outside the store (which a failure leaves as it was)."""
    key = derivation_key(KIND, inputs)
    path = scratch.system_temp() / f"envbuild-{canonicalize_name(req.dist)}-{key[:12]}.log"
    path.write_text(outcome.log, encoding="utf-8")
    return path


def _failure(
    req: SourceBuildRequest, outcome: BuildOutcome, max_jobs: int, log_file: Path
) -> BuildFailed:
    tail = "\n".join(outcome.log.rstrip().splitlines()[-LOG_TAIL:])
    tail += f"\n(the whole log: {log_file})"
    argv = ["build", req.dist, req.version]
    if was_killed(outcome):
        return BuildFailed(
            "build",
            argv,
            outcome.returncode,
            tail,
            summary=f"building {req.dist} {req.version} was killed (signal 9: out of memory?) "
            f"with MAX_JOBS={max_jobs}",
            hint=f"lower MAX_JOBS (it was {max_jobs}) in [builds.{req.dist}.env], or leave it "
            "out to have it chosen from the memory model (`envbuild store plan` shows the "
            "estimate and a safe value), or build on a bigger machine and `envbuild store "
            "add-wheel` the result",
        )
    if arch := unsupported_arch(outcome):
        return BuildFailed(
            "build",
            argv,
            outcome.returncode,
            tail,
            summary=f"building {req.dist} {req.version} failed: nvcc cannot compile {arch}",
            hint="drop that arch from the build flags or use a CUDA toolkit that supports it",
        )
    return BuildFailed(
        "build",
        argv,
        outcome.returncode,
        tail,
        summary=f"building {req.dist} {req.version} failed (exit status {outcome.returncode})",
        hint="read the log's tail above; rerun with -v to see the whole build",
    )


def _result(
    req: SourceBuildRequest,
    drv: Derivation,
    *,
    reused: bool,
    changes: list[InputChange] | None = None,
    previous: str | None = None,
) -> BuildResult:
    return BuildResult(
        dist=canonicalize_name(req.dist),
        version=req.version,
        key=drv.key,
        reused=reused,
        wheel=str(drv.meta.get("wheel", "")),
        wheel_digest=drv.outputs["wheel"],
        log_digest=drv.outputs.get("log"),
        audit=Audit.model_validate(drv.meta.get("audit", {})),
        max_jobs=drv.meta.get("max_jobs"),
        changes=changes or [],
        previous=previous,
        origin=str(drv.meta.get("origin", "built")),
    )


def add_wheel(
    req: SourceBuildRequest, builder: Builder, store: Store, wheel: Path, *, checked: bool = False
) -> BuildResult:
    """Record a wheel built elsewhere under the key a build here would have, after checking it
    (:func:`check_wheel_file`, unless the caller did: ``checked``) and auditing it."""
    if not checked:
        check_wheel_file(req, wheel)
    int_flags(req)
    toolchain = builder.probe(cuda=req.needs_cuda)
    inputs = inputs_of(req, toolchain, builder)
    audit = audit_wheel(wheel)
    check_audit(req, audit, wheel.name)
    with store.session():
        digest = store.add_file(wheel)
        drv = store.record(
            KIND, inputs, {"wheel": digest}, _meta(req, wheel.name, audit, None, origin="added")
        )
    log.info("%s %s: added %s as build %s", req.dist, req.version, wheel.name, drv.key[:12])
    return _result(req, drv, reused=False)


def wheel_path(store: Store, result: BuildResult) -> Path:
    """The stored wheel (a read-only blob; copy it under ``result.wheel`` to install it)."""
    return store.blob_path(result.wheel_digest)
