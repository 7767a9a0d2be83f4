"""The compilers a source build uses: where they are, which versions, which GPU archs they can emit.

nvcc is looked for in ``$ENVBUILD_NVCC``, ``$CUDA_HOME/bin``, ``$CUDA_PATH/bin``, PATH and
``/usr/local/cuda/bin``, in that order. NVIDIA's PyPI wheels (``nvidia-cuda-nvcc`` with
``nvidia-cuda-crt``, ``nvidia-nvvm`` and ``nvidia-cuda-runtime``) lay out a working toolkit under
``site-packages/nvidia/cu13``; point ``ENVBUILD_NVCC`` or ``CUDA_HOME`` there.

Also here: reading the arch lists of the build flags (``TORCH_CUDA_ARCH_LIST`` in torch's
``8.0;9.0+PTX`` form, ``FLASH_ATTN_CUDA_ARCHS`` in flash-attn's ``80;90;120`` form) and choosing
``MAX_JOBS`` from free memory.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from envbuild import proc
from envbuild.audit import Arch
from envbuild.errors import ToolNotFound

NVCC_HINT = (
    "install the CUDA toolkit (/usr/local/cuda), or NVIDIA's wheels: `pip install "
    "nvidia-cuda-nvcc nvidia-cuda-crt nvidia-nvvm nvidia-cuda-runtime`, then set ENVBUILD_NVCC "
    "(or CUDA_HOME) to that toolkit"
)

#: flash-attn's own estimate: about 9 GB of memory per compile job at 4 nvcc threads.
GB_PER_JOB_AT_4_THREADS = 9.0


def find_nvcc(*, required: bool = True, env: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if env is None else env
    candidates: list[str] = []
    if value := env.get("ENVBUILD_NVCC"):
        if not (os.access(value, os.X_OK) and Path(value).is_file()):
            if not required:
                return None
            raise ToolNotFound(
                f"nvcc (the CUDA compiler) at ENVBUILD_NVCC={value}",
                hint="point ENVBUILD_NVCC at an nvcc binary, or unset it to search CUDA_HOME, "
                "PATH and /usr/local/cuda",
            )
        return value
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if value := env.get(var):
            candidates.append(str(Path(value) / "bin" / "nvcc"))
    if found := shutil.which("nvcc", path=env.get("PATH")):
        candidates.append(found)
    candidates.append("/usr/local/cuda/bin/nvcc")
    for candidate in candidates:
        if os.access(candidate, os.X_OK) and Path(candidate).is_file():
            return candidate
    if required:
        raise ToolNotFound("nvcc (the CUDA compiler)", hint=NVCC_HINT)
    return None


@dataclass(frozen=True)
class Nvcc:
    path: str
    version: str  # 13.0.88
    sass: tuple[str, ...]  # sm_75 … as `nvcc --list-gpu-code` says
    ptx: tuple[str, ...]  # compute_75 …

    @property
    def release(self) -> str:
        return ".".join(self.version.split(".")[:2])

    @property
    def cuda_home(self) -> str:
        return str(Path(self.path).resolve().parent.parent)

    def can_compile(self, arch: Arch, *, ptx: bool = False) -> bool:
        """Whether this toolkit can emit code for ``arch`` (an a/f variant needs its base arch)."""
        base = Arch(arch.major, arch.minor)
        return (base.ptx in self.ptx) if ptx else (base.sass in self.sass)


_NVCC_VERSION = re.compile(r"\bV(\d+\.\d+\.\d+)")


def nvcc_info(path: str) -> Nvcc:
    env = proc.child_env()
    version_out = proc.run([path, "--version"], tool="nvcc", env=env).stdout
    codes = proc.run([path, "--list-gpu-code"], tool="nvcc", env=env).stdout
    archs = proc.run([path, "--list-gpu-arch"], tool="nvcc", env=env).stdout
    return parse_nvcc(path, version_out, codes, archs)


def parse_nvcc(path: str, version_out: str, codes: str, archs: str) -> Nvcc:
    """An :class:`Nvcc` from what ``nvcc --version``, ``--list-gpu-code`` and
    ``--list-gpu-arch`` printed (here or in a builder container)."""
    m = _NVCC_VERSION.search(version_out)
    if not m:
        raise ToolNotFound(f"nvcc at {path} (its --version said nothing like V13.0.88)")
    return Nvcc(
        path=path,
        version=m.group(1),
        sass=tuple(c for c in codes.split() if c.startswith("sm_")),
        ptx=tuple(a for a in archs.split() if a.startswith("compute_")),
    )


def compiler_version(name: str, *, env: Mapping[str, str] | None = None) -> str:
    """``gcc``/``g++`` full version (``12.2.0``); ToolNotFound when the compiler is missing."""
    found = shutil.which(name, path=(env or os.environ).get("PATH"))
    if found is None:
        raise ToolNotFound(
            f"{name} (the host C/C++ compiler)",
            hint="install it (Debian: apt-get install build-essential) or set CC/CXX",
        )
    out = proc.run([found, "-dumpfullversion", "-dumpversion"], tool=name).stdout.strip()
    return out.splitlines()[0] if out else "unknown"


# --- arch lists in build flags ---------------------------------------------------------------


@dataclass(frozen=True)
class ArchRequest:
    """One architecture a build flag asks for: SASS for ``arch``, PTX too when ``ptx``."""

    variable: str
    text: str
    arch: Arch
    sass: bool = True
    ptx: bool = False


def requested_archs(env: Mapping[str, str]) -> list[ArchRequest]:
    """The archs named by ``TORCH_CUDA_ARCH_LIST`` and ``FLASH_ATTN_CUDA_ARCHS``.

    Raises ValueError naming the variable and the item when an entry is not an architecture.
    """
    out: list[ArchRequest] = []
    torch_list = env.get("TORCH_CUDA_ARCH_LIST", "")
    for item in re.split(r"[;\s]+", torch_list.strip()):
        if not item:
            continue
        plain = item.removesuffix("+PTX")
        try:
            arch = Arch.parse(plain)
        except ValueError:
            raise ValueError(
                f"TORCH_CUDA_ARCH_LIST: {item!r} is not an architecture (expected like "
                "8.0, 9.0a or 12.0+PTX)"
            ) from None
        out.append(ArchRequest("TORCH_CUDA_ARCH_LIST", item, arch, True, item.endswith("+PTX")))
    for item in re.split(r"[;,\s]+", env.get("FLASH_ATTN_CUDA_ARCHS", "").strip()):
        if not item:
            continue
        try:
            arch = Arch.parse(item)
        except ValueError:
            raise ValueError(
                f"FLASH_ATTN_CUDA_ARCHS: {item!r} is not an architecture (expected like 80 "
                "or 120, separated by ';')"
            ) from None
        out.append(ArchRequest("FLASH_ATTN_CUDA_ARCHS", item, arch))
    return out


def unsupported(requests: list[ArchRequest], nvcc: Nvcc) -> list[ArchRequest]:
    return [
        r
        for r in requests
        if (r.sass and not nvcc.can_compile(r.arch))
        or (r.ptx and not nvcc.can_compile(r.arch, ptx=True))
    ]


# --- MAX_JOBS --------------------------------------------------------------------------------


def available_memory_bytes() -> int:
    """Memory a build may use: MemAvailable, capped by the cgroup's limit when there is one."""
    avail = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except OSError:
        avail = 0
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit != "max":
            avail = min(avail or int(limit), max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return avail


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def choose_max_jobs(
    nvcc_threads: int, *, memory: int | None = None, cores: int | None = None
) -> int:
    """Compile jobs that fit: ~9 GB per job at 4 nvcc threads (scaled by threads), at most one
    per core, at least one."""
    memory = available_memory_bytes() if memory is None else memory
    cores = cpu_count() if cores is None else cores
    per_job = GB_PER_JOB_AT_4_THREADS * 1e9 * max(1, nvcc_threads) / 4
    return max(1, min(cores, int(memory // per_job)))
