"""The facts of the knowledge base, typed: the strict pydantic models of ``knowledge.toml`` (next
to this module; each fact with its ``source``) and :func:`knowledge`, which loads and checks the
file once. The questions asked of the facts are in :mod:`envbuild.spec.knowledge`.
"""

from __future__ import annotations

import functools
import re
import tomllib
from importlib import resources
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from envbuild.spec.scalars import (
    ComputeCapability,
    DriverVersion,
    MajorMinor,
    Specifier,
    VersionStr,
)


def _regex(value: str) -> str:
    re.compile(value)
    return value


def _loose_driver(value: str) -> str:
    if not re.fullmatch(r"\d{3}(\.\d{1,3}){0,2}", value):
        raise ValueError(f"{value!r} is not a driver version")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Fact(_Strict):
    source: str = Field(min_length=1, description="where the fact comes from")


class CudaMinDriver(Fact):
    cuda: VersionStr
    driver: DriverVersion


class CudaMajorMinDriver(Fact):
    major: int
    driver: Annotated[str, AfterValidator(_loose_driver)]


class CudaArchs(Fact):
    cuda: Specifier
    archs: list[ComputeCapability]


class GpuFact(Fact):
    name: str
    aliases: list[str] = Field(default_factory=list)
    compute_capability: ComputeCapability
    memory_gib: float


class TorchPypi(Fact):
    torch: Specifier
    cuda: Annotated[str, Field(pattern=r"^cu\d{3}$")]


class VllmTorch(Fact):
    pins: dict[VersionStr, VersionStr]


class Gguf(Fact):
    vllm: Specifier
    packages: list[str]
    extra: str | None = None


class ModelFamily(Fact):
    name: str
    repo: Annotated[str, AfterValidator(_regex)]
    attention: Literal["mla", "gqa"]
    min_vllm: VersionStr


class KvCacheRule(Fact):
    attention: Literal["mla", "gqa"]
    cc_major: int
    vllm: Specifier
    dtypes: list[str]


class KvCacheDtypes(Fact):
    dtypes: list[str]


class DebianSuite(Fact):
    suite: str
    version: str
    glibc: MajorMinor
    python: MajorMinor


class SourceBuildFact(Fact):
    name: str
    versions: Specifier
    sdist_only: bool = False
    arch_env: str | None = None
    arch_format: Literal["sm", "torch"] = "sm"
    arch_default: str | None = None
    arch_accepted: list[str] | None = None
    arch_min_cuda: dict[str, VersionStr] = Field(default_factory=dict)
    force_build_env: str | None = None
    force_build_value: str | None = None
    int_env: list[str] = Field(default_factory=list)


class SourcePatchFact(Fact):
    """A patch envbuild applies to an sdist before building it, when the locked torch matches:
    what the real build taught (a flag the package's setup.py hardcodes). The file lives in
    ``envbuild/spec/source-patches/``; its sha256 is an input of the build's key."""

    dist: str
    versions: Specifier
    torch: Specifier = Field(description="the locked torch versions that need it")
    patch: str = Field(description="file name in envbuild/spec/source-patches/")
    why: str


class BuildMemory(Fact):
    """Peak resident memory of one compile job of a source build (nvcc with its cicc, ptxas
    and host compiler), as measured: ``gb_per_arch`` for each arch nvcc's threads work on at
    once, plus ``gb_base``. With ``--threads T`` and A archs nvcc runs min(T, A) of them at a
    time, so a job needs about ``gb_base + gb_per_arch * min(T, A)``."""

    name: str
    versions: Specifier
    gb_base: float
    gb_per_arch: float


class TorchArchList(Fact):
    env: str
    format: str


class SecretFlag(Fact):
    """A serve flag whose value is a secret (``serve.extra_args`` must give it as ``${VAR}``)."""

    flag: Annotated[str, Field(pattern=r"^--[a-z0-9-]+$")]
    values: Literal["one", "many", "optional"]
    env: str


class Knowledge(_Strict):
    kb_version: Literal[1]
    verified: str
    cuda_min_driver: list[CudaMinDriver]
    cuda_major_min_driver: list[CudaMajorMinDriver]
    cuda_archs: list[CudaArchs]
    gpus: list[GpuFact]
    torch_pypi: list[TorchPypi]
    vllm_torch: VllmTorch
    gguf: list[Gguf]
    model_families: list[ModelFamily]
    kv_cache: list[KvCacheRule]
    vllm_kv_cache_dtypes: KvCacheDtypes
    debian: list[DebianSuite]
    source_builds: list[SourceBuildFact]
    source_patches: list[SourcePatchFact] = Field(default_factory=list)
    build_memory: list[BuildMemory] = Field(default_factory=list)
    torch_cuda_arch_list: TorchArchList
    secret_flags: list[SecretFlag]


@functools.cache
def knowledge() -> Knowledge:
    """The knowledge base shipped with envbuild (parsed and checked once)."""
    text = resources.files("envbuild.spec").joinpath("knowledge.toml").read_text("utf-8")
    return Knowledge.model_validate(tomllib.loads(text))
