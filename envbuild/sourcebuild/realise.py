"""Source builds as derivations: a wheel built once per input set, audited for its GPU archs.

A source build's inputs are the sdist (its sha256 from the lock), the exact torch it builds
against (version and wheel sha256 from the lock), the Python version, the compilers as found
(gcc, g++, nvcc), the build flags the spec declares (``FLASH_ATTENTION_FORCE_BUILD=TRUE`` forced
for flash-attn, so it never fetches a prebuilt wheel), the build requirements, the locked pins of
what the build venv installs (``constraints``: the lock's dependency closure of the build
requirements and torch, :func:`envbuild.sourcebuild.requests.build_closure`; no other locked
package) and
where the build runs. Their canonical JSON names the derivation
(:func:`envbuild.store.core.derivation_key`); the output is the wheel and the build log, both blobs
in
the store, and the record keeps the audit (:mod:`envbuild.sourcebuild.audit`) of every compiled
file of the
wheel.

Same inputs: the stored wheel is reused. Changed inputs: it is built again, and the result says
which inputs changed since the last build of that distribution (a list item by item:
``constraints: torch==2.14.0 -> torch==2.14.1``). A build that fails, is killed for
memory, or whose audit lacks a target GPU's compute capability leaves the store as it was.

``MAX_JOBS`` and ``NVCC_THREADS`` are not key inputs (they change the build's speed, not its
output). ``MAX_JOBS`` not pinned by the spec is chosen from the knowledge base's measured memory
model of one compile job (:func:`plan_jobs`), the available memory and the cores; a pinned one
that would not fit is warned about at build start with a safe value. The value used is recorded
in the derivation's meta.
"""

from __future__ import annotations

import logging
import re
import shutil
import tarfile
import tempfile
import tomllib
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, computed_field

from envbuild.build.wheels import target_tags
from envbuild.errors import (
    EnvironmentFailure,
    InputFileError,
    IntegrityError,
    ToolFailed,
    UserError,
)
from envbuild.fsio import sha256_file
from envbuild.sourcebuild.audit import Audit, audit_wheel
from envbuild.sourcebuild.builder import (
    Builder,
    BuildJob,
    BuildOutcome,
    Toolchain,
    unsupported_arch,
    was_killed,
)
from envbuild.sourcebuild.patches import verify_record
from envbuild.sourcebuild.toolchain import (
    JobMemory,
    build_memory_budget,
    cpu_count,
    job_memory,
    requested_archs,
    unsupported,
)
from envbuild.spec import knowledge
from envbuild.spec.checks.builds import INT_ENV, is_count
from envbuild.store.core import Derivation, Output, Store, derivation_key

log = logging.getLogger("envbuild.sourcebuild.realise")

KIND = "source-build"
#: Flags envbuild sets whatever the spec says: flash-attn's setup.py otherwise downloads a
#: prebuilt wheel from GitHub when one matches, silently.
FORCED_ENV: dict[str, dict[str, str]] = {"flash-attn": {"FLASH_ATTENTION_FORCE_BUILD": "TRUE"}}
#: Flags that decide how fast a build runs, not what it makes: passed to the build, recorded in
#: the derivation's meta, never inputs of its key (a wheel built with MAX_JOBS=2 is the one a
#: 16-job build makes; nvcc's --threads only splits the per-arch work across threads).
SPEED_ENV = frozenset({"MAX_JOBS", "NVCC_THREADS"})
#: Build requirements beyond the sdist's ``[build-system]``: flash-attn has none declared.
EXTRA_REQUIRES: dict[str, list[str]] = {
    "flash-attn": ["ninja", "packaging", "psutil", "setuptools", "wheel"],
}
#: The PEP 517 fallback when an sdist declares no build system (setuptools < 70.1 needs wheel).
DEFAULT_REQUIRES = ["setuptools>=40.8.0", "wheel"]
LOG_TAIL = 40
#: Where the knowledge base's sdist patches live (``[[source_patches]]``).
SOURCE_PATCHES = Path(__file__).resolve().parents[1] / "spec" / "source-patches"


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


class InputChange(_Model):
    """One input that differs. For a list input (``constraints``, ``requires``) each added,
    removed or changed item is a change of its own, ``item`` true and ``old``/``new`` the
    items (None: not there)."""

    key: str = Field(description="dotted path of the input")
    old: Any = None
    new: Any = None
    item: bool = Field(False, description="old and new are items of the list input key")

    def render(self) -> str:
        if not self.item:
            return f"{self.key}: {_short(self.old)} -> {_short(self.new)}"
        if self.old is None:
            return f"{self.key}: added {self.new}"
        if self.new is None:
            return f"{self.key}: removed {self.old}"
        return f"{self.key}: {self.old} -> {self.new}"


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
    """A value as a change shows it: leaves (strings, numbers) whole, so two long values that
    differ at their end still read as different; only a whole list or table is cut."""
    text = repr(value)
    if not isinstance(value, list | dict) or len(text) <= 200:
        return text
    return text[:197] + "..."


# --- inputs --------------------------------------------------------------------------------


def inputs_of(req: SourceBuildRequest, toolchain: Toolchain, builder: Builder) -> dict[str, Any]:
    """The derivation inputs: what decides the wheel's bytes (no host path, no secret, no time)."""
    requires = sorted({*req.requires, *EXTRA_REQUIRES.get(canonicalize_name(req.dist), [])})
    patched = {"source_patches": [p.model_dump() for p in sdist_patches(req)]}
    return {
        "dist": canonicalize_name(req.dist),
        "version": req.version,
        "sdist": {"name": req.sdist.name, "sha256": req.sdist.sha256},
        "torch": req.torch.model_dump() if req.torch else None,
        "python": toolchain.python,
        "compilers": dict(sorted(toolchain.compilers.items())),
        "env": {k: v for k, v in sorted(req.build_env.items()) if k not in SPEED_ENV},
        "requires": requires,
        "constraints": sorted(req.constraints),
        "exclude_newer": req.exclude_newer,
        "builder": builder.identity(),
        **(patched if patched["source_patches"] else {}),
    }


class SdistPatch(_Model):
    """A patch envbuild applies to the unpacked sdist (a ``[[source_patches]]`` fact)."""

    name: str
    sha256: str


def sdist_patches(req: SourceBuildRequest) -> list[SdistPatch]:
    """The knowledge base's patches for ``req``'s sdist against its locked torch, with their
    sha256 (inputs of the key): what the real build showed the package's setup.py needs."""
    torch = req.torch.version if req.torch else None
    return [
        SdistPatch(name=f.patch, sha256=sha256_file(SOURCE_PATCHES / f.patch))
        for f in knowledge.source_patches(req.dist, req.version, torch)
    ]


def patch_sdist(
    sdist: Path, patches: list[SdistPatch], work: Path, *, folder: Path = SOURCE_PATCHES
) -> Path:
    """``sdist`` unpacked (tarfile's ``data`` filter: nothing outside, no devices or links
    out), patched with ``folder``'s files (GNU patch -p1, exactly or not at all) and packed
    again under its own name in ``work/patched``; ``sdist`` itself when there is nothing to
    apply."""
    if not patches:
        return sdist
    from envbuild.sourcebuild.patches import apply_patch

    tree = work / "sdist-src"
    try:
        with tarfile.open(sdist) as tar:
            tar.extractall(tree, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise InputFileError(sdist.name, f"is not a readable sdist: {exc}") from None
    tops = [p for p in tree.iterdir() if p.is_dir()]
    if len(tops) != 1:
        raise InputFileError(sdist.name, "does not hold one top folder, as an sdist does")
    for patch in patches:
        path = folder / patch.name
        if sha256_file(path) != patch.sha256:
            raise IntegrityError(
                f"{path}: sha256 {sha256_file(path)}, the build's key holds {patch.sha256}",
                hint="the patch changed after the key was computed; run the build again",
            )
        apply_patch(tops[0], path, f"envbuild/spec/source-patches/{patch.name}")
    out = work / "patched" / sdist.name
    out.parent.mkdir()
    with tarfile.open(out, "w:gz") as tar:
        tar.add(tops[0], arcname=tops[0].name, filter=_reset)
    return out


def _reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out or {prefix: {}}
    return {prefix: value}


def _item_id(item: str) -> str:
    """What names a requirement or pin in a list (``torch==2.14.0 ; marker`` -> ``torch ;
    marker``), so that a new version of it reads as a change, not a removal and an addition."""
    spec, _, marker = item.partition(";")
    name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
    head = canonicalize_name(name.group(1)) if name else spec.strip()
    return f"{head} ;{' '.join(marker.split())}" if marker.strip() else head


def _diff_items(key: str, old: list[str], new: list[str]) -> list[InputChange]:
    a = {_item_id(i): i for i in old}
    b = {_item_id(i): i for i in new}
    if len(a) != len(old) or len(b) != len(new):  # two items with one name: compare whole items
        a, b = {i: i for i in old}, {i: i for i in new}
    return [
        InputChange(key=key, old=a.get(i), new=b.get(i), item=True)
        for i in sorted(set(a) | set(b))
        if a.get(i) != b.get(i)
    ]


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(i, str) for i in value)


def diff_inputs(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[InputChange]:
    """Which inputs differ, as dotted keys (``env.FLASH_ATTN_CUDA_ARCHS``), sorted. A list of
    strings (requirements, pins) is compared item by item: ``constraints: torch==2.14.0 ->
    torch==2.14.1``, ``constraints: added sympy==1.14.0``."""
    a, b = _flatten(dict(old)), _flatten(dict(new))
    out: list[InputChange] = []
    for k in sorted(set(a) | set(b)):
        before, after = a.get(k), b.get(k)
        if before == after:
            continue
        if _strings(before if before is not None else []) and _strings(
            after if after is not None else []
        ):
            out += _diff_items(k, before or [], after or [])
        else:
            out.append(InputChange(key=k, old=before, new=after))
    return out


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


def int_flags(req: SourceBuildRequest) -> dict[str, int]:
    """``MAX_JOBS`` and ``NVCC_THREADS`` as the spec pins them; a value that is not a positive
    whole number is the spec's mistake (exit 2), never a crash."""
    out: dict[str, int] = {}
    env = req.build_env
    for var in INT_ENV:
        if var not in env:
            continue
        if not is_count(env[var]):
            raise UserError(
                f"{req.where or req.dist}: builds.{req.dist}.env.{var} must be a positive whole "
                f"number, not {env[var]!r}",
                hint=f'write it like {var} = "8"'
                + (
                    ", or leave it out to have it chosen from free memory"
                    if var == "MAX_JOBS"
                    else ""
                ),
            )
        out[var] = int(env[var])
    return out


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


def check_wheel_name(req: SourceBuildRequest, filename: str) -> frozenset[Tag]:
    """The wheel's name and version are the locked ones; returns its tags."""
    try:
        name, version, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename as exc:
        raise InputFileError(filename, f"is not a wheel file name: {exc}") from None
    if name != canonicalize_name(req.dist) or version.public != Version(req.version).public:
        raise InputFileError(
            filename,
            f"is {name} {version}, not {canonicalize_name(req.dist)} {req.version} as locked",
        )
    return tags


def check_wheel_tags(req: SourceBuildRequest, filename: str, tags: frozenset[Tag]) -> None:
    """Some tag of the wheel fits the target's CPython and platform (when the request names
    them, as requests from a lock do)."""
    if not req.python or not req.platform:
        return
    if tags & set(target_tags(req.python, req.platform)):
        return
    shown = ", ".join(sorted(str(t) for t in tags))
    cp = "cp" + "".join(req.python.split(".")[:2])
    arch = re.sub(r"^(manylinux|musllinux)_\d+_\d+_|^[a-z]+linux\d*_|^linux_", "", req.platform)
    raise InputFileError(
        filename,
        f"is tagged {shown}: it cannot be installed on the target, CPython {req.python} on "
        f"{req.platform}",
        hint=f"build it with CPython {req.python} on {arch} Linux (tagged {cp}-{cp}-linux_{arch} "
        f"or manylinux_…_{arch}), or change [python] version",
    )


def check_wheel_contents(req: SourceBuildRequest, wheel: Path) -> None:
    """The wheel holds the locked distribution's ``.dist-info`` (METADATA, WHEEL, RECORD) and
    every file verifies against its RECORD."""
    _, version, _, _ = parse_wheel_filename(wheel.name)
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = {i.filename for i in zf.infolist() if not i.is_dir()}
            infos = {n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")}
            info = next((d for d in sorted(infos) if _is_dist_info(d, req.dist, version)), None)
            if info is None:
                found = ", ".join(sorted(infos)) or "none"
                raise InputFileError(
                    wheel,
                    f"has no .dist-info of {canonicalize_name(req.dist)} {version} "
                    f"(found: {found})",
                    hint="a wheel holds <name>-<version>.dist-info with METADATA, WHEEL and "
                    "RECORD; build it again with `uv build --wheel` or pip wheel",
                )
            missing = [f for f in ("METADATA", "WHEEL", "RECORD") if f"{info}/{f}" not in names]
            if missing:
                raise InputFileError(wheel, f"{info} lacks {', '.join(missing)}")
        problems = verify_record(wheel, f"{info}/RECORD")
    except (zipfile.BadZipFile, OSError, UnicodeDecodeError, ValueError, IndexError) as exc:
        raise InputFileError(wheel, f"is not a readable wheel: {exc}") from None
    if problems:
        shown = "; ".join(problems[:5]) + (
            f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        )
        raise InputFileError(
            wheel,
            f"does not verify against its RECORD: {shown}",
            hint="the wheel was changed after it was built, or damaged in transit; copy it again",
        )


def _is_dist_info(folder: str, dist: str, version: Version) -> bool:
    name, sep, ver = folder.removesuffix(".dist-info").rpartition("-")
    if not sep:
        return False
    try:
        return canonicalize_name(name) == canonicalize_name(dist) and Version(ver) == version
    except InvalidVersion:
        return False


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


class JobsPlan(_Model):
    """How many compile jobs a build runs, why, and whether that fits the builder's memory."""

    dist: str
    max_jobs: int
    pinned: bool = Field(description="MAX_JOBS is the spec's, not envbuild's choice")
    nvcc_threads: int
    archs: int = Field(description="archs each file is compiled for")
    per_job_bytes: int
    per_job_source: str
    memory_bytes: int = Field(
        description="what the build may use: MemAvailable, capped by the cgroup limit and "
        "$ENVBUILD_BUILD_MEMORY"
    )
    cores: int
    safe_max_jobs: int = Field(description="the most jobs that fit the memory and cores")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def peak_bytes(self) -> int:
        """The estimated peak: MAX_JOBS jobs at once, each at its model's peak."""
        return self.max_jobs * self.per_job_bytes

    @computed_field  # type: ignore[prop-decorator]
    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.memory_bytes

    def render(self) -> str:
        how = "pinned by the spec" if self.pinned else "chosen from the memory model"
        return (
            f"MAX_JOBS={self.max_jobs} ({how}) x NVCC_THREADS={self.nvcc_threads}: about "
            f"{self.peak_bytes / 1e9:.1f} GB at peak ({self.per_job_bytes / 1e9:.1f} GB per job: "
            f"{self.per_job_source}); {self.memory_bytes / 1e9:.1f} GB available, "
            f"{self.cores} cores"
        )

    def warning(self) -> str | None:
        if self.fits:
            return None
        return (
            f"{self.dist}: MAX_JOBS={self.max_jobs} x NVCC_THREADS={self.nvcc_threads} needs "
            f"about {self.peak_bytes / 1e9:.1f} GB ({self.max_jobs} jobs x "
            f"{self.per_job_bytes / 1e9:.1f} GB: {self.per_job_source}) but "
            f"{self.memory_bytes / 1e9:.1f} GB is available: the build may be killed; a safe "
            f"value here is MAX_JOBS={self.safe_max_jobs} (or leave MAX_JOBS out to have it "
            "chosen from free memory)"
        )

    def warn(self) -> JobsPlan:
        log.info("%s: building with %s", self.dist, self.render())
        if text := self.warning():
            log.warning("%s", text)
        return self


def plan_jobs(
    req: SourceBuildRequest, *, memory: int | None = None, cores: int | None = None
) -> JobsPlan:
    """MAX_JOBS for ``req`` on this machine: the spec's when pinned (checked against the
    memory model), else as many jobs as fit. The per-job memory is the knowledge base's
    measured model (``[[build_memory]]``) for the distribution, else flash-attn's rule."""
    pinned = int_flags(req)
    threads = pinned.get("NVCC_THREADS", 4)
    try:
        archs = len({r.arch for r in requested_archs(req.build_env) if r.sass or r.ptx})
    except ValueError:
        archs = 0
    fact = knowledge.build_memory(req.dist, req.version)
    per_job: JobMemory = (
        job_memory(threads, archs, gb_base=fact.gb_base, gb_per_arch=fact.gb_per_arch)
        if fact
        else job_memory(threads, archs)
    )
    memory = build_memory_budget() if memory is None else memory
    cores = cpu_count() if cores is None else cores
    safe = per_job.jobs_that_fit(memory, cores)
    return JobsPlan(
        dist=req.dist,
        max_jobs=pinned.get("MAX_JOBS") or safe,
        pinned="MAX_JOBS" in pinned,
        nvcc_threads=threads,
        archs=archs,
        per_job_bytes=per_job.per_job_bytes,
        per_job_source=per_job.source,
        memory_bytes=memory,
        cores=cores,
        safe_max_jobs=safe,
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


def check_wheel_file(req: SourceBuildRequest, wheel: Path) -> None:
    """A wheel built elsewhere can stand for ``req``'s build: it is the locked distribution and
    version, tagged for the target's Python and platform, with a ``.dist-info`` whose RECORD
    verifies. Each failure is the user's (exit 2), naming the file."""
    if not wheel.is_file():
        raise InputFileError(wheel, "no such file")
    check_wheel_tags(req, wheel.name, check_wheel_name(req, wheel.name))
    check_wheel_contents(req, wheel)


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


Progress = Callable[[str], None]
