"""Source builds as derivations: a wheel built once per input set, audited for its GPU archs.

A source build's inputs are the sdist (its sha256 from the lock), the exact torch it builds
against (version and wheel sha256 from the lock), the Python version, the compilers as found
(gcc, g++, nvcc), the build flags the spec declares (``FLASH_ATTENTION_FORCE_BUILD=TRUE`` forced
for flash-attn, so it never fetches a prebuilt wheel), the build requirements and where the build
runs. Their canonical JSON names the derivation (:func:`envbuild.store.derivation_key`); the
output is the wheel and the build log, both blobs in the store, and the record keeps the audit
(:mod:`envbuild.audit`) of every compiled file of the wheel.

Same inputs: the stored wheel is reused. Changed inputs: it is built again, and the result says
which inputs changed since the last build of that distribution. A build that fails, is killed for
memory, or whose audit lacks a target GPU's compute capability leaves the store as it was.

``MAX_JOBS`` not pinned by the spec is chosen from free memory and cores and recorded in the
derivation's meta; it is not a key input (it changes the build's speed, not its output).
"""

from __future__ import annotations

import logging
import shutil
import tarfile
import tempfile
import tomllib
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version
from pydantic import BaseModel, ConfigDict, Field

from envbuild.audit import Audit, audit_wheel
from envbuild.builder import (
    Builder,
    BuildJob,
    BuildOutcome,
    Toolchain,
    unsupported_arch,
    was_killed,
)
from envbuild.errors import (
    EnvironmentFailure,
    InputFileError,
    IntegrityError,
    ToolFailed,
    UserError,
)
from envbuild.fsio import sha256_file
from envbuild.store import Derivation, Output, Store, derivation_key
from envbuild.toolchain import choose_max_jobs, requested_archs, unsupported

log = logging.getLogger("envbuild.sourcebuild")

KIND = "source-build"
#: Flags envbuild sets whatever the spec says: flash-attn's setup.py otherwise downloads a
#: prebuilt wheel from GitHub when one matches, silently.
FORCED_ENV: dict[str, dict[str, str]] = {"flash-attn": {"FLASH_ATTENTION_FORCE_BUILD": "TRUE"}}
#: Build requirements beyond the sdist's ``[build-system]``: flash-attn has none declared.
EXTRA_REQUIRES: dict[str, list[str]] = {
    "flash-attn": ["ninja", "packaging", "psutil", "setuptools", "wheel"],
}
#: The PEP 517 fallback when an sdist declares no build system (setuptools < 70.1 needs wheel).
DEFAULT_REQUIRES = ["setuptools>=40.8.0", "wheel"]
LOG_TAIL = 40


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FileRef(_Model):
    name: str = Field(description="file name")
    url: str
    sha256: str
    size: int | None = None


class TorchRef(_Model):
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
    constraints: list[str] = Field(default_factory=list)
    index_url: str | None = None
    extra_index_urls: list[str] = Field(default_factory=list)
    exclude_newer: str | None = None
    target_ccs: list[str] = Field(default_factory=list, description="the GPUs' capabilities")
    where: str | None = Field(None, description="the spec file and line declaring the build")

    @property
    def build_env(self) -> dict[str, str]:
        return {**self.env, **FORCED_ENV.get(canonicalize_name(self.dist), {})}

    @property
    def needs_cuda(self) -> bool:
        return bool(requested_archs(self.build_env)) or self.torch is not None


class InputChange(_Model):
    key: str = Field(description="dotted path of the input")
    old: Any = None
    new: Any = None

    def render(self) -> str:
        return f"{self.key}: {_short(self.old)} -> {_short(self.new)}"


class BuildResult(_Model):
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


class BuildFailed(ToolFailed):
    """A source build failed; carries the log's tail. ``killed``: it ran out of memory."""


class ArchMissing(UserError):
    """The built wheel holds no code for a target GPU's compute capability."""


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --- inputs --------------------------------------------------------------------------------


def inputs_of(req: SourceBuildRequest, toolchain: Toolchain, builder: Builder) -> dict[str, Any]:
    """The derivation inputs: what decides the wheel's bytes (no host path, no secret, no time)."""
    requires = sorted({*req.requires, *EXTRA_REQUIRES.get(canonicalize_name(req.dist), [])})
    return {
        "dist": canonicalize_name(req.dist),
        "version": req.version,
        "sdist": {"name": req.sdist.name, "sha256": req.sdist.sha256},
        "torch": req.torch.model_dump() if req.torch else None,
        "python": toolchain.python,
        "compilers": dict(sorted(toolchain.compilers.items())),
        "env": dict(sorted(req.build_env.items())),
        "requires": requires,
        "constraints": sorted(req.constraints),
        "exclude_newer": req.exclude_newer,
        "builder": builder.identity(),
    }


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out or {prefix: {}}
    return {prefix: value}


def diff_inputs(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[InputChange]:
    """Which inputs differ, as dotted keys (``env.FLASH_ATTN_CUDA_ARCHS``), sorted."""
    a, b = _flatten(dict(old)), _flatten(dict(new))
    return [
        InputChange(key=k, old=a.get(k), new=b.get(k))
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k)
    ]


def previous_build(
    store: Store, dist: str, *, kind: str = KIND, not_key: str = ""
) -> Derivation | None:
    """The last derivation of ``kind`` recorded for ``dist`` (by record time), but ``not_key``."""
    best: tuple[int, Derivation] | None = None
    wanted = canonicalize_name(dist)
    for key in store.derivations():
        if key == not_key:
            continue
        path = store.drvs / f"{key}.json"
        try:
            drv = Derivation.model_validate_json(path.read_bytes())
            stamp = path.stat().st_mtime_ns
        except (OSError, ValueError):
            continue
        if (
            drv.kind == kind
            and drv.inputs.get("dist") == wanted
            and (best is None or stamp > best[0])
        ):
            best = (stamp, drv)
    return best[1] if best else None


# --- checks ---------------------------------------------------------------------------------


def check_archs(req: SourceBuildRequest, toolchain: Toolchain) -> None:
    """Every arch the flags ask for must be one the toolkit can compile."""
    try:
        requests = requested_archs(req.build_env)
    except ValueError as exc:
        raise UserError(f"{req.where or req.dist}: {exc}") from None
    if not requests:
        return
    nvcc = toolchain.nvcc
    assert nvcc is not None, "needs_cuda implies an nvcc was probed"
    bad = unsupported(requests, nvcc)
    if bad:
        names = ", ".join(f"{r.variable}={r.text!r} ({r.arch.sass})" for r in bad)
        raise UserError(
            f"{req.where or req.dist}: builds.{req.dist}.env: nvcc {nvcc.version} cannot compile "
            f"{names}",
            hint=f"this toolkit emits {', '.join(nvcc.sass)}; drop the arch or use a CUDA toolkit "
            "that supports it",
        )


def check_audit(req: SourceBuildRequest, audit: Audit, wheel: str) -> None:
    missing = audit.missing(req.target_ccs)
    if not any(f.has_device_code for f in audit.files) and req.needs_cuda and req.target_ccs:
        raise ArchMissing(
            f"{req.dist} {req.version}: {wheel} holds no GPU code at all, but the target GPUs "
            f"are {', '.join(req.target_ccs)}",
            hint="check the build's CUDA flags and that nvcc ran (see the build log)",
        )
    if missing:
        lines = "; ".join(f"{f}: no SASS or PTX for {', '.join(ccs)}" for f, ccs in missing.items())
        raise ArchMissing(
            f"{req.dist} {req.version}: the audit of {wheel} found no code for a target GPU: "
            f"{lines} (found SASS {', '.join(audit.sass) or 'none'}, PTX "
            f"{', '.join(audit.ptx) or 'none'})",
            hint="add the GPU's arch to the build flags (FLASH_ATTN_CUDA_ARCHS / "
            "TORCH_CUDA_ARCH_LIST); flags are intent, the audit is what the wheel holds",
        )


def check_wheel_name(req: SourceBuildRequest, filename: str) -> None:
    try:
        name, version, _, _ = parse_wheel_filename(filename)
    except InvalidWheelFilename as exc:
        raise InputFileError(filename, f"is not a wheel file name: {exc}") from None
    if name != canonicalize_name(req.dist) or version.public != Version(req.version).public:
        raise InputFileError(
            filename,
            f"is {name} {version}, not {canonicalize_name(req.dist)} {req.version} as locked",
        )


# --- the sdist ------------------------------------------------------------------------------


def fetch_sdist(sdist: FileRef, dest_dir: Path) -> Path:
    """Download (or copy, for ``file://``) the sdist and check its sha256."""
    dest = dest_dir / sdist.name
    parsed = urllib.parse.urlparse(sdist.url)
    try:
        if parsed.scheme == "file" or not parsed.scheme:
            shutil.copyfile(urllib.request.url2pathname(parsed.path), dest)
        else:
            import ssl

            from envbuild import __version__

            ctx = ssl.create_default_context(cafile=_ca_file())
            request = urllib.request.Request(
                sdist.url, headers={"User-Agent": f"envbuild/{__version__}"}
            )
            with (
                urllib.request.urlopen(request, timeout=120, context=ctx) as r,
                dest.open("wb") as f,
            ):
                shutil.copyfileobj(r, f, 1 << 20)
    except (OSError, ValueError) as exc:
        raise EnvironmentFailure(f"cannot fetch {sdist.name} from {sdist.url}: {exc}") from None
    got = sha256_file(dest)
    if got != sdist.sha256:
        raise IntegrityError(
            f"{sdist.name}: sha256 {got}, the lock promises {sdist.sha256}",
            hint="the index served other bytes than when the lock was made; relock",
        )
    return dest


def _ca_file() -> str | None:
    import os

    return os.environ.get("SSL_CERT_FILE") or None


def build_system_requires(sdist: Path) -> list[str]:
    """``[build-system] requires`` of an sdist, or the PEP 517 fallback."""
    try:
        with tarfile.open(sdist) as tar:
            member = next(
                (
                    m
                    for m in tar.getmembers()
                    if m.name.count("/") == 1 and m.name.endswith("/pyproject.toml")
                ),
                None,
            )
            if member is None:
                return list(DEFAULT_REQUIRES)
            f = tar.extractfile(member)
            data = tomllib.loads(f.read().decode()) if f else {}
    except (tarfile.TarError, OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputFileError(sdist.name, f"is not a readable sdist: {exc}") from None
    system = data.get("build-system")
    if not isinstance(system, dict):
        return list(DEFAULT_REQUIRES)
    requires = system.get("requires", [])
    return [str(r) for r in requires] if isinstance(requires, list) else []


# --- realizing ------------------------------------------------------------------------------


def realize(
    req: SourceBuildRequest,
    builder: Builder,
    store: Store,
    *,
    memory: int | None = None,
) -> BuildResult:
    """The wheel for ``req``: from the store when its inputs were built before, else built."""
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
            substituted = store.build(
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

        realized = store.build(KIND, inputs, run)
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
    env = req.build_env
    threads = int(env.get("NVCC_THREADS", "4") or 4)
    max_jobs = (
        int(env["MAX_JOBS"]) if env.get("MAX_JOBS") else choose_max_jobs(threads, memory=memory)
    )
    env = {**env, "MAX_JOBS": str(max_jobs)}
    how = "pinned by the spec" if req.env.get("MAX_JOBS") else "chosen from free memory"
    log.info("%s %s: building with MAX_JOBS=%d (%s)", req.dist, req.version, max_jobs, how)
    with store.temp_dir(prefix="build-") as work:
        (work / "out").mkdir()
        sdist = fetch_sdist(req.sdist, work)
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
    path = Path(tempfile.gettempdir()) / f"envbuild-{canonicalize_name(req.dist)}-{key[:12]}.log"
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
            hint=f"lower MAX_JOBS (it was {max_jobs}; each flash-attn job needs about 9 GB at 4 "
            "nvcc threads) in [builds." + req.dist + ".env], or build on a bigger machine and "
            "`envbuild store add-wheel` the result",
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


def add_wheel(req: SourceBuildRequest, builder: Builder, store: Store, wheel: Path) -> BuildResult:
    """Record a wheel built elsewhere under the key a build here would have, after auditing it."""
    if not wheel.is_file():
        raise InputFileError(wheel, "no such file")
    check_wheel_name(req, wheel.name)
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


Progress = Callable[[str], None]
