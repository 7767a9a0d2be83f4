"""The spec: what an experiment depends on, as strict pydantic models.

A spec file is TOML; after ``extends`` are merged it must match :class:`Spec`. Unknown keys are
errors. Types are checked here (the scalar ones, a version or a commit sha, are in
:mod:`envbuild.spec.scalars`); whether the GPU stack fits together (driver vs CUDA, torch vs
vLLM, archs vs GPUs) is checked by :mod:`envbuild.spec.check` against the knowledge base.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from packaging.utils import canonicalize_name
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from envbuild.spec.scalars import (
    CommitSha,
    ComputeCapability,
    CudaVersion,
    DebianPackage,
    DebianSuite,
    DistName,
    DriverVersion,
    EnvName,
    GgufQuant,
    HfRepo,
    HostName,
    ImagePath,
    ImageRef,
    IndexUrl,
    MajorMinor,
    MirrorUrl,
    RepoPath,
    RequirementStr,
    Sha256,
    Specifier,
    Text,
    TorchIndex,
    VersionStr,
    Word,
)

SPEC_VERSION = 1

#: ``${NAME}`` inside a value refers to the caller's environment: a secret, resolved only at run
#: time and never written into a lock, an image or a manifest.
SECRET_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class Strict(BaseModel):
    """A table of the spec: unknown keys are errors, values are not coerced, nothing changes."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Gpu(Strict):
    model: str = Field(description="GPU model as the knowledge base names it")
    count: PositiveInt = 1
    compute_capability: ComputeCapability | None = Field(
        None, description="taken from the knowledge base when omitted"
    )
    memory_gib: PositiveFloat | None = Field(None, description="per GPU; from the knowledge base")
    interconnect: Literal["pcie", "nvlink"] = "pcie"


class Host(Strict):
    driver: DriverVersion
    gpus: list[Gpu] = Field(min_length=1)


class Cuda(Strict):
    version: CudaVersion
    source: Literal["pypi", "base", "host"] = Field(
        "pypi",
        description="where the toolkit comes from: NVIDIA's wheels on PyPI, the base image, or "
        "the host's /usr/local/cuda",
    )


class DebianBase(Strict):
    kind: Literal["debian"]
    suite: DebianSuite = "bookworm"
    mirror: MirrorUrl = "http://deb.debian.org/debian"
    packages: list[DebianPackage] = Field(default_factory=list)
    variant: Literal["essential", "apt", "required", "minbase"] = "essential"


MaxUnpacked = Annotated[
    PositiveFloat | None,
    Field(
        description="refuse the base when its layers expand to more than this many GiB "
        "(default: 64 GiB, and at most 100 times each compressed layer beyond its first GiB)"
    ),
]


class ImageBase(Strict):
    kind: Literal["image"]
    ref: ImageRef
    max_unpacked_gib: MaxUnpacked = None


class OciLayoutBase(Strict):
    kind: Literal["oci-layout"]
    path: RepoPath
    digest: Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")] | None = None
    max_unpacked_gib: MaxUnpacked = None


class RootfsBase(Strict):
    kind: Literal["rootfs"]
    path: RepoPath
    sha256: Sha256
    max_unpacked_gib: MaxUnpacked = None


Base = Annotated[DebianBase | ImageBase | OciLayoutBase | RootfsBase, Field(discriminator="kind")]


class Python(Strict):
    version: MajorMinor
    platform: str | None = Field(
        None,
        pattern=r"^(manylinux_\d+_\d+|musllinux_\d+_\d+)_(x86_64|aarch64)$",
        description="wheel platform tag; derived from the base's glibc when omitted",
    )
    interpreter: ImagePath = "/usr/bin/python3"
    venv: ImagePath = "/opt/venv"


class Torch(Strict):
    version: VersionStr
    cuda: Annotated[str, Field(pattern=r"^(cu\d{3}|cpu)$")] = Field(
        description="the wheel's CUDA variant: cu130, cu132 … or cpu"
    )
    index: TorchIndex = Field(
        "pypi", description="'pypi', or the URL of the index the wheel comes from"
    )


class SourceBuild(Strict):
    version: VersionStr
    env: dict[EnvName, Text] = Field(
        default_factory=dict,
        description="build flags as environment variables (MAX_JOBS, TORCH_CUDA_ARCH_LIST …)",
    )


class Vllm(Strict):
    version: VersionStr
    extras: list[DistName] = Field(default_factory=list)


#: What vLLM reads from a tokenizer or config repo (not its weights).
AUX_FILES = ["*.json", "*.py", "*.txt", "*.model", "*.tiktoken", "*.jinja", "*.md"]


class AuxRepo(Strict):
    """A repo the unit reads besides the model's own (its tokenizer, its HF config), pinned to a
    commit of that repo and fetched into the cache with the model."""

    repo: HfRepo
    revision: CommitSha
    files: list[Text] = Field(
        default_factory=lambda: list(AUX_FILES),
        description="allow patterns (default: config, tokenizer and code files, no weights)",
    )


class GgufModel(Strict):
    """How vllm-gguf-plugin loads the model: the path of the quant's first ``.gguf`` file in
    the pinned snapshot apply fetched (the plugin knows a local GGUF by its path and finds the
    other ``-0000k-of-0000n`` shards beside it). Its ``local_dir:quant_type`` form takes only
    GGML's own quant names, not Unsloth's ``UD-`` ones."""

    quant: GgufQuant = Field(
        description="the quant type the files are named by (their name holds -QUANT- or -QUANT.)"
    )
    folder: Text = Field(
        "", description="the folder of the repo holding the quant's .gguf files ('' for the top)"
    )
    file: str = Field(
        description="the quant's first .gguf file in that folder, as the repo names it "
        "(GLM-5-UD-IQ2_XXS-00001-of-00006.gguf): the unit's model argument"
    )

    @field_validator("file")
    @classmethod
    def _gguf_file(cls, value: str) -> str:
        if "/" in value or not value.endswith(".gguf") or value.startswith("."):
            raise ValueError(f"{value!r} must be a .gguf file name (its folder is `folder`)")
        return value

    @model_validator(mode="after")
    def _file_of_quant(self) -> GgufModel:
        if f"-{self.quant}." not in self.file and f"-{self.quant}-" not in self.file:
            raise ValueError(f"{self.file!r} is not named by the quant {self.quant!r}")
        return self

    @field_validator("folder")
    @classmethod
    def _relative(cls, value: str) -> str:
        path = PurePosixPath(value)
        if value and (path.is_absolute() or ".." in path.parts or value.endswith("/")):
            raise ValueError(f"{value!r} must be a folder inside the repo, like UD-IQ2_XXS")
        return value


class Model(Strict):
    repo: HfRepo
    revision: CommitSha
    size_gb: PositiveFloat = Field(description="expected size on disk, in GB (10^9 bytes)")
    files: list[Text] = Field(
        default_factory=list, description="allow patterns; empty means the whole repo"
    )
    tokenizer: AuxRepo | None = Field(None, description="a tokenizer from another repo")
    config: AuxRepo | None = Field(None, description="the HF config from another repo")
    gguf: GgufModel | None = Field(None, description="GGUF files, loaded by vllm-gguf-plugin")

    @model_serializer(mode="wrap")
    def _without_unset_repos(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A spec that names none of these dumps (and hashes) as before they existed, so its
        # lock and generations stay current.
        data: dict[str, Any] = handler(self)
        for key in ("tokenizer", "config", "gguf"):
            if data.get(key, 0) is None:
                del data[key]
        return data

    def repos(self) -> list[Model | AuxRepo]:
        """Every repo the unit reads, each (repo, revision) once, the model's own first; where
        two name the same one, the fetch takes both sets of files."""
        out: list[Model | AuxRepo] = [self]
        for aux in (self.config, self.tokenizer):
            if aux is None:
                continue
            for i, have in enumerate(out):
                if (have.repo, have.revision) == (aux.repo, aux.revision):
                    if have.files:  # an empty list is the whole repo already
                        files = sorted({*have.files, *aux.files})
                        out[i] = AuxRepo(repo=aux.repo, revision=aux.revision, files=files)
                    break
            else:
                out.append(aux)
        return out


class Serve(Strict):
    tensor_parallel_size: PositiveInt = 1
    pipeline_parallel_size: PositiveInt = 1
    max_model_len: PositiveInt | None = None
    kv_cache_dtype: Word = "auto"
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.9
    served_model_name: Word | None = None
    host: HostName = "0.0.0.0"
    port: Annotated[int, Field(ge=1, le=65535)] = 8000
    extra_args: list[Text] = Field(default_factory=list)
    env: dict[EnvName, Text] = Field(
        default_factory=dict, description="values may reference the caller's env as ${NAME}"
    )


class Image(Strict):
    cmd: list[Text] | None = Field(
        None, description="the image's command; defaults to `vllm serve` when [serve] is given"
    )
    env: dict[EnvName, Text] = Field(default_factory=dict)
    labels: dict[Text, Text] = Field(default_factory=dict)
    workdir: ImagePath = "/"
    overlaps: dict[DistName, DistName] = Field(
        default_factory=dict,
        description="where two distributions install the same path, which one wins: "
        '`"cuda-python" = "cuda-bindings"` keeps cuda-bindings\' files; without an entry an '
        "overlap is an error",
    )
    max_layers: Annotated[int, Field(ge=8, le=120)] = Field(
        60, description="layer budget of the image (Docker's limit is 125)"
    )
    link_findings: dict[str, str] = Field(
        default_factory=dict,
        description="link-check findings accepted, by id (`dist:library` or `dist:symbols`), "
        'each with the reason: `"numba:libtbb.so.12" = "optional TBB threading layer"`; '
        "without an entry a finding fails build and apply",
    )


class Resolution(Strict):
    exclude_newer: datetime = Field(
        description="uv's --exclude-newer: relocking later gives the same answer"
    )
    index_url: IndexUrl = "https://pypi.org/simple"
    extra_index_urls: list[IndexUrl] = Field(default_factory=list)

    @field_validator("exclude_newer")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        if value.tzinfo is None:
            raise ValueError("needs a time zone (write it like 2026-11-01T00:00:00Z)")
        return value


class Spec(Strict):
    """A whole experiment, after ``extends`` are merged."""

    spec_version: Literal[1] = 1
    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")]
    description: Text = ""
    host: Host | None = None
    cuda: Cuda | None = None
    base: Base
    python: Python
    torch: Torch | None = None
    vllm: Vllm | None = None
    builds: dict[DistName, SourceBuild] = Field(default_factory=dict)
    packages: dict[DistName, Specifier] = Field(
        default_factory=dict, description="other distributions: name = specifier ('' for any)"
    )
    requirements: list[RequirementStr] = Field(
        default_factory=list, description="extra requirements in PEP 508 form"
    )
    patches: dict[DistName, list[RepoPath]] = Field(default_factory=dict)
    model: Model | None = None
    serve: Serve | None = None
    image: Image = Field(default_factory=lambda: Image())
    resolution: Resolution

    def secret_refs(self) -> list[tuple[str, str]]:
        """Every ``(dotted key, variable)`` whose value references the caller's environment."""
        found: list[tuple[str, str]] = []

        def walk(value: Any, key: str) -> None:
            if isinstance(value, str):
                found.extend((key, m.group(1)) for m in SECRET_REF.finditer(value))
            elif isinstance(value, dict):
                for k, v in value.items():
                    walk(v, f"{key}.{k}" if key else str(k))
            elif isinstance(value, list):
                for i, v in enumerate(value):
                    walk(v, f"{key}[{i}]")

        walk(self.model_dump(mode="json"), "")
        return found

    def gpu_ccs(self) -> list[str]:
        if not self.host:
            return []
        return sorted({g.compute_capability for g in self.host.gpus if g.compute_capability})

    def normalized_packages(self) -> dict[str, str]:
        return {canonicalize_name(k): v for k, v in self.packages.items()}
