"""The spec's scalar types: strings that must be a version, a driver, a compute capability, a
commit sha, a specifier, a distribution name, a requirement, a Hugging Face repo id, an image
pinned by digest, a sha256 or a path. Each is a ``str`` with a validator whose error says what was
expected; :mod:`envbuild.spec.model` and :mod:`envbuild.spec.facts` build their tables of them.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Annotated

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import AfterValidator, Field


def _version(value: str) -> str:
    try:
        Version(value)
    except InvalidVersion:
        raise ValueError(f"{value!r} is not a version (expected something like 2.14.0)") from None
    return value


def _driver(value: str) -> str:
    if not re.fullmatch(r"\d{3}(\.\d{1,3}){1,2}", value):
        raise ValueError(f"{value!r} is not an NVIDIA driver version (expected like 590.48.01)")
    return value


def _major_minor(value: str) -> str:
    if not re.fullmatch(r"\d+\.\d+", value):
        raise ValueError(f"{value!r} is not a MAJOR.MINOR version (expected like 13.1)")
    return value


def _cuda_version(value: str) -> str:
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?", value):
        raise ValueError(f"{value!r} is not a CUDA version (expected like 13.1 or 13.1.1)")
    return value


def _compute_capability(value: str) -> str:
    if not re.fullmatch(r"\d{1,2}\.\d", value):
        raise ValueError(f"{value!r} is not a compute capability (expected like 12.0)")
    return value


def _commit_sha(value: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{40}", value):
        raise ValueError(
            f"{value!r} is not a commit sha (expected 40 lowercase hex digits; a branch or tag "
            "moves, a commit does not)"
        )
    return value


def _specifier(value: str) -> str:
    try:
        SpecifierSet(value)
    except InvalidSpecifier:
        raise ValueError(
            f"{value!r} is not a version specifier (expected like '==1.2.3', '>=2,<3' or '')"
        ) from None
    return value


def _dist_name(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", value):
        raise ValueError(f"{value!r} is not a distribution name")
    return value


def _requirement(value: str) -> str:
    try:
        Requirement(value)
    except InvalidRequirement as exc:
        raise ValueError(f"{value!r} is not a requirement: {exc}") from None
    return value


def _hf_repo(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", value):
        raise ValueError(f"{value!r} is not a Hugging Face repo id (expected like org/name)")
    return value


def _image_ref_by_digest(value: str) -> str:
    if not re.fullmatch(r"[^@\s]+@sha256:[0-9a-f]{64}", value):
        raise ValueError(
            f"{value!r} is not pinned by digest (expected like "
            "nvcr.io/nvidia/cuda:13.1.0-devel-ubuntu24.04@sha256:<64 hex>); a tag moves, a "
            "digest does not"
        )
    return value


def _sha256(value: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{64}", value):
        raise ValueError(f"{value!r} is not a sha256 (expected 64 lowercase hex digits)")
    return value


def _abs_posix(value: str) -> str:
    if not PurePosixPath(value).is_absolute() or ".." in PurePosixPath(value).parts:
        raise ValueError(f"{value!r} must be an absolute path inside the image, without '..'")
    return value


def _quant(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_+-]+", value):
        raise ValueError(f"{value!r} is not a GGUF quant type (expected like Q4_K_M, UD-IQ2_XXS)")
    return value


VersionStr = Annotated[str, AfterValidator(_version)]
DriverVersion = Annotated[str, AfterValidator(_driver)]
MajorMinor = Annotated[str, AfterValidator(_major_minor)]
CudaVersion = Annotated[str, AfterValidator(_cuda_version)]
ComputeCapability = Annotated[str, AfterValidator(_compute_capability)]
CommitSha = Annotated[str, AfterValidator(_commit_sha)]
Specifier = Annotated[str, AfterValidator(_specifier)]
DistName = Annotated[str, AfterValidator(_dist_name)]
RequirementStr = Annotated[str, AfterValidator(_requirement)]
HfRepo = Annotated[str, AfterValidator(_hf_repo)]
ImageRef = Annotated[str, AfterValidator(_image_ref_by_digest)]
Sha256 = Annotated[str, AfterValidator(_sha256)]
ImagePath = Annotated[str, AfterValidator(_abs_posix)]
GgufQuant = Annotated[str, AfterValidator(_quant)]
#: A path relative to the spec file; the loader checks it stays inside the repository.
RepoPath = Annotated[str, Field(min_length=1)]
