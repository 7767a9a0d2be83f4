"""The knowledge base of the GPU stack: the questions asked of its facts.

The facts live in ``knowledge.toml``, each with its source, typed and loaded once by
:mod:`envbuild.spec.facts`; this module answers small questions of them: the minimum
driver of a CUDA release, the archs a toolkit compiles, a GPU's compute capability, the torch a
vLLM release pins, the wheel platform tag of a spec's base. It holds no rules of its own: the
checks in :mod:`envbuild.spec.check` combine these answers.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from envbuild.spec import facts
from envbuild.spec.model import DebianBase, Spec

#: The CPU architecture the wheel platform tag is derived for (the Debian bases are amd64).
DEFAULT_MACHINE = "x86_64"


# --- small helpers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SecretArg:
    """Where a secret flag's value stands in an argument list: ``index`` of the argument (which
    is ``--flag=value`` when ``inline``), ``value`` None when a value is missing."""

    index: int
    flag: facts.SecretFlag
    value: str | None
    inline: bool = False


def secret_args(args: Sequence[str]) -> list[SecretArg]:
    """The values of the secret flags (:class:`~envbuild.spec.facts.SecretFlag`) in ``args``, a
    vLLM command line (``--api_key`` is ``--api-key``: vLLM's parser takes both)."""
    flags = {f.flag: f for f in facts.knowledge().secret_flags}
    found: list[SecretArg] = []
    i = 0
    while i < len(args):
        name, eq, inline = args[i].partition("=")
        fact = flags.get(name.replace("_", "-")) if name.startswith("--") else None
        if fact is None:
            i += 1
            continue
        if eq:
            found.append(SecretArg(i, fact, inline, inline=True))
            i += 1
            continue
        j = i + 1
        while (
            j < len(args) and not args[j].startswith("-") and (fact.values == "many" or j == i + 1)
        ):
            found.append(SecretArg(j, fact, args[j]))
            j += 1
        if j == i + 1 and fact.values != "optional":
            found.append(SecretArg(i, fact, None))
        i = j
    return found


def driver_key(driver: str) -> tuple[int, ...]:
    """A driver version as a comparable tuple: ``"590.48.01"`` → ``(590, 48, 1)``."""
    return tuple(int(part) for part in driver.split("."))


def _version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _in(spec: str, version: str) -> bool:
    v = _version(version)
    return v is not None and SpecifierSet(spec).contains(v, prereleases=True)


def gpu_name_key(name: str) -> str:
    """A GPU model name as compared: lower case, without a leading "NVIDIA", runs of spaces,
    dashes and underscores as one space ("NVIDIA H200-NVL" and "h200 nvl" are one model)."""
    text = name.lower().strip()
    text = re.sub(r"^nvidia\s+", "", text)
    return re.sub(r"[\s_-]+", " ", text)


# --- questions -------------------------------------------------------------------------------


def min_driver(cuda: str) -> facts.CudaMinDriver | None:
    """The minimum driver of a CUDA release: the fact for that release, or for the latest
    update of the same ``MAJOR.MINOR`` not newer than it. None when the KB has no such release."""
    v = _version(cuda)
    if v is None:
        return None
    best: facts.CudaMinDriver | None = None
    for fact in facts.knowledge().cuda_min_driver:
        fv = Version(fact.cuda)
        if (
            fv.release[:2] == v.release[:2]
            and fv <= v
            and (best is None or fv > Version(best.cuda))
        ):
            best = fact
    return best


def major_min_driver(major: int) -> facts.CudaMajorMinDriver | None:
    """The driver any CUDA ``major``.x release needs (minor version compatibility)."""
    return next((f for f in facts.knowledge().cuda_major_min_driver if f.major == major), None)


def newest_cuda_for(driver: str, major: int) -> str | None:
    """The newest ``MAJOR.MINOR`` release of CUDA ``major`` whose GA minimum ``driver`` meets."""
    fits = [
        Version(f.cuda)
        for f in facts.knowledge().cuda_min_driver
        if Version(f.cuda).major == major and driver_key(driver) >= driver_key(f.driver)
    ]
    newest = max(fits, default=None)
    return f"{newest.major}.{newest.minor}" if newest else None


#: NVIDIA's run-time compilers on PyPI (``-cu12``/``-cu13`` names too). Their versions are the
#: CUDA release they come from, and PTX they emit needs a driver of that release or newer.
RUN_TIME_COMPILERS = frozenset(
    {"nvidia-nvjitlink", "nvidia-cuda-nvrtc", "nvidia-cuda-nvcc", "nvidia-nvvm"}
)


def newer_run_time_compilers(cuda: str, packages: Iterable[tuple[str, str]]) -> list[str]:
    """``name version`` of each run-time compiler among ``packages`` from a CUDA minor newer
    than ``cuda`` (the newest the driver runs) of the same major: the driver cannot load the
    PTX it emits (SASS still loads: CUDA minor version compatibility)."""
    runs = _minor(cuda)
    if runs is None:
        return []
    return [
        f"{name} {version}"
        for name, version in packages
        if is_run_time_compiler(name)
        and (made := _minor(version)) is not None
        and made[0] == runs[0]
        and made > runs
    ]


def is_run_time_compiler(name: str) -> bool:
    return re.sub(r"-cu\d+$", "", name) in RUN_TIME_COMPILERS


def _minor(version: str) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def toolkit_archs(cuda: str) -> facts.CudaArchs | None:
    """The compute capabilities nvcc of CUDA release ``cuda`` can compile for."""
    return next((f for f in facts.knowledge().cuda_archs if _in(f.cuda, cuda)), None)


def gpu(model: str) -> facts.GpuFact | None:
    """The GPU a spec names, by name or alias (case, dashes and a leading "NVIDIA" ignored)."""
    wanted = gpu_name_key(model)
    for fact in facts.knowledge().gpus:
        if wanted in {gpu_name_key(n) for n in (fact.name, *fact.aliases)}:
            return fact
    return None


def suggest_gpu(model: str) -> list[str]:
    """Known GPU names close to ``model``, best first."""
    names = {gpu_name_key(n): f.name for f in facts.knowledge().gpus for n in (f.name, *f.aliases)}
    close = difflib.get_close_matches(gpu_name_key(model), list(names), n=3, cutoff=0.5)
    out: list[str] = []
    for c in close:
        if names[c] not in out:
            out.append(names[c])
    return out


def vllm_torch(vllm: str) -> str | None:
    """The torch version a vLLM release pins (``Requires-Dist: torch==X``)."""
    v = _version(vllm)
    if v is None:
        return None
    for release, torch in facts.knowledge().vllm_torch.pins.items():
        if Version(release) == v:
            return torch
    return None


def torch_pypi_cuda(torch: str) -> facts.TorchPypi | None:
    """The CUDA variant of torch ``torch``'s wheels on PyPI."""
    v = _version(torch)
    if v is None:
        return None
    return next((f for f in facts.knowledge().torch_pypi if _in(f.torch, v.public)), None)


def gguf(vllm: str) -> facts.Gguf | None:
    """How a vLLM release reads GGUF checkpoints (built in, or through a plugin package)."""
    return next((f for f in facts.knowledge().gguf if _in(f.vllm, vllm)), None)


def model_family(repo: str) -> facts.ModelFamily | None:
    """The model family a Hugging Face repo id belongs to, when the KB knows it."""
    return next(
        (f for f in facts.knowledge().model_families if re.search(f.repo, repo, re.IGNORECASE)),
        None,
    )


def kv_cache_rules(compute_capability: str, vllm: str) -> list[facts.KvCacheRule]:
    """The KV-cache dtype rules for an architecture and a vLLM release (one per attention kind)."""
    major = int(compute_capability.split(".", maxsplit=1)[0])
    return [f for f in facts.knowledge().kv_cache if f.cc_major == major and _in(f.vllm, vllm)]


def debian(suite: str) -> facts.DebianSuite | None:
    return next((f for f in facts.knowledge().debian if f.suite == suite), None)


def glibc_of_suite(suite: str) -> str | None:
    """The glibc version (``MAJOR.MINOR``) of a Debian suite."""
    fact = debian(suite)
    return fact.glibc if fact else None


def source_patches(name: str, version: str, torch: str | None) -> list[facts.SourcePatchFact]:
    """The patches envbuild applies to ``name`` ``version``'s sdist when built against
    ``torch`` (none without torch), in the knowledge base's order."""
    from packaging.utils import canonicalize_name

    if torch is None:
        return []
    return [
        f
        for f in facts.knowledge().source_patches
        if canonicalize_name(f.dist) == canonicalize_name(name)
        and _in(f.versions, version)
        and _in(f.torch, torch)
    ]


def build_memory(name: str, version: str) -> facts.BuildMemory | None:
    """The measured memory model of ``name`` ``version``'s compile jobs, when there is one."""
    from packaging.utils import canonicalize_name

    for fact in facts.knowledge().build_memory:
        if canonicalize_name(fact.name) == canonicalize_name(name) and _in(fact.versions, version):
            return fact
    return None


def source_build(name: str, version: str) -> facts.SourceBuildFact | None:
    """What the KB knows about building ``name`` ``version`` from source (its env flags)."""
    from packaging.utils import canonicalize_name

    for fact in facts.knowledge().source_builds:
        if canonicalize_name(fact.name) == canonicalize_name(name) and _in(fact.versions, version):
            return fact
    return None


def platform_glibc(tag: str) -> tuple[int, int] | None:
    """The glibc a ``manylinux_X_Y_arch`` tag requires, as ``(X, Y)``."""
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)_\w+", tag)
    return (int(m.group(1)), int(m.group(2))) if m else None


def derived_platform(spec: Spec) -> str | None:
    """The platform tag the spec's base implies (Debian: its glibc), ignoring python.platform."""
    base = spec.base
    if isinstance(base, DebianBase):
        glibc = glibc_of_suite(base.suite)
        if glibc:
            major, minor = glibc.split(".")
            return f"manylinux_{major}_{minor}_{DEFAULT_MACHINE}"
    return None


def target_platform(spec: Spec) -> str | None:
    """The wheel platform tag to resolve for: ``python.platform`` when given, else derived from
    the base's glibc. None when neither is known (a registry image without ``python.platform``)."""
    return spec.python.platform or derived_platform(spec)
