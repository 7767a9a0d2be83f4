"""What a source build must be, checked: its flags, its audit, and a wheel that stands for it.

Before a build: the archs the flags ask for are ones the toolkit compiles (:func:`check_archs`),
``MAX_JOBS``/``NVCC_THREADS`` are counts (:func:`int_flags`). After it: the audit
(:mod:`envbuild.sourcebuild.audit`) finds code for every target GPU (:func:`check_audit`,
:class:`ArchMissing`). A wheel built elsewhere (``envbuild store add-wheel``) is the locked
distribution and version, tagged for the target, and verifies against its RECORD
(:func:`check_wheel_file`). Every failure is the user's (exit 2) and names the spec line or file.
"""

from __future__ import annotations

import logging
import re
import zipfile
from pathlib import Path

from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from envbuild.errors import ArchMissing, InputFileError, UserError
from envbuild.lock.wheels import target_tags
from envbuild.sourcebuild.audit import Audit
from envbuild.sourcebuild.builder import Toolchain
from envbuild.sourcebuild.patches import verify_record
from envbuild.sourcebuild.requests import SourceBuildRequest
from envbuild.sourcebuild.toolchain import requested_archs, unsupported
from envbuild.spec.checks.builds import INT_ENV, is_count

log = logging.getLogger(__name__)


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
    """The audit of ``wheel`` found SASS or PTX that runs on every target GPU (:class:`ArchMissing`
    otherwise, and when a CUDA build holds no GPU code at all)."""
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


def check_wheel_file(req: SourceBuildRequest, wheel: Path) -> None:
    """A wheel built elsewhere can stand for ``req``'s build: it is the locked distribution and
    version, tagged for the target's Python and platform, with a ``.dist-info`` whose RECORD
    verifies. Each failure is the user's (exit 2), naming the file."""
    if not wheel.is_file():
        raise InputFileError(wheel, "no such file")
    check_wheel_tags(req, wheel.name, check_wheel_name(req, wheel.name))
    check_wheel_contents(req, wheel)
