"""The compilers a source build uses: where they are, which versions, which GPU archs they can emit.

nvcc is looked for in ``$ENVBUILD_NVCC``, ``$CUDA_HOME/bin``, ``$CUDA_PATH/bin``, PATH and
``/usr/local/cuda/bin``, in that order; cuobjdump (the audit's reference reader) in
``$ENVBUILD_CUOBJDUMP``, beside nvcc, then PATH. NVIDIA's PyPI wheels (``nvidia-cuda-nvcc`` with
``nvidia-cuda-crt``, ``nvidia-nvvm`` and ``nvidia-cuda-runtime``) lay out a working toolkit under
``site-packages/nvidia/cu13``; point ``ENVBUILD_NVCC`` or ``CUDA_HOME`` there.

Also here: whether nvcc can emit the archs the build flags ask for (read by
:mod:`envbuild.spec.archs`) and a ``CUDA_HOME`` for one build. ``MAX_JOBS`` and memory are
:mod:`envbuild.sourcebuild.jobs`'.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from envbuild.errors import ToolNotFound
from envbuild.proc import core as proc
from envbuild.spec.archs import Arch, ArchRequest, ListFormat, parse_list

log = logging.getLogger(__name__)

NVCC_HINT = (
    "install the CUDA toolkit (/usr/local/cuda), or NVIDIA's wheels: `pip install "
    "nvidia-cuda-nvcc nvidia-cuda-crt nvidia-nvvm nvidia-cuda-runtime`, then set ENVBUILD_NVCC "
    "(or CUDA_HOME) to that toolkit"
)


def find_nvcc(*, required: bool = True, env: Mapping[str, str] | None = None) -> str | None:
    """nvcc from ``$ENVBUILD_NVCC``, ``$CUDA_HOME/bin``, ``$CUDA_PATH/bin``, PATH or
    ``/usr/local/cuda/bin``; ToolNotFound (or None when not ``required``) without one."""
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


def find_cuobjdump(*, env: Mapping[str, str] | None = None) -> str | None:
    """cuobjdump (the reference reader of fatbins the audit can use) from
    ``$ENVBUILD_CUOBJDUMP``, beside the nvcc envbuild uses, or PATH; None without one."""
    env = os.environ if env is None else env
    if found := env.get("ENVBUILD_CUOBJDUMP"):
        return found
    nvcc = find_nvcc(required=False, env=env)
    if nvcc is not None and (Path(nvcc).parent / "cuobjdump").is_file():
        return str(Path(nvcc).parent / "cuobjdump")
    return shutil.which("cuobjdump", path=env.get("PATH"))


@dataclass(frozen=True)
class Nvcc:
    path: str
    version: str  # 13.0.88
    sass: tuple[str, ...]  # sm_75 … as `nvcc --list-gpu-code` says
    ptx: tuple[str, ...]  # compute_75 …
    home: str | None = None  # the toolkit nvcc says it runs from (None: from its path)

    @property
    def release(self) -> str:
        return ".".join(self.version.split(".")[:2])

    @property
    def cuda_home(self) -> str:
        return self.home or str(Path(self.path).resolve().parent.parent)

    def can_compile(self, arch: Arch, *, ptx: bool = False) -> bool:
        """Whether this toolkit can emit code for ``arch`` (an a/f variant needs its base arch)."""
        base = Arch(arch.major, arch.minor)
        return (base.ptx in self.ptx) if ptx else (base.sass in self.sass)


#: What a toolkit made of NVIDIA's wheels needs beside nvcc to compile a torch extension, by
#: the wheel that ships it: (path under CUDA_HOME, alternatives, wheel).
_TOOLKIT_PARTS = (
    ("nvvm/bin/cicc", (), "nvidia-nvvm"),
    ("include/crt/host_config.h", ("bin/crt/host_config.h",), "nvidia-cuda-crt"),
    ("include/cuda_runtime.h", (), "nvidia-cuda-runtime"),
    # cuda_fp16.h includes <nv/target>: CCCL's, under include/cccl from CUDA 13 on
    ("include/cccl/nv/target", ("include/nv/target",), "nvidia-cuda-cccl"),
)


def check_toolkit(nvcc: Nvcc) -> None:
    """The toolkit around ``nvcc`` has what a CUDA extension build includes and runs (nvvm's
    cicc, crt, the runtime headers, CCCL's ``nv/target``): a missing part is one clear
    message naming the wheel that ships it, before a build starts, not a compile error an
    hour in."""
    home = Path(nvcc.cuda_home)
    for path, alternatives, wheel in _TOOLKIT_PARTS:
        if not any((home / p).is_file() for p in (path, *alternatives)):
            raise ToolNotFound(
                f"{path} of the CUDA toolkit at {home} (nvcc {nvcc.version})",
                hint=f"it comes with NVIDIA's {wheel} wheel: install `{wheel}=={nvcc.release}.*` "
                "beside nvcc (as scripts/test does), or use a whole toolkit (/usr/local/cuda)",
            )


_NVCC_VERSION = re.compile(r"\bV(\d+\.\d+\.\d+)")


def nvcc_info(path: str) -> Nvcc:
    env = proc.child_env()
    version_out = proc.run([path, "--version"], tool="nvcc", env=env).stdout
    codes = proc.run([path, "--list-gpu-code"], tool="nvcc", env=env).stdout
    archs = proc.run([path, "--list-gpu-arch"], tool="nvcc", env=env).stdout
    found = parse_nvcc(path, version_out, codes, archs)
    return Nvcc(found.path, found.version, found.sass, found.ptx, toolkit_home(path))


_HERE = re.compile(r"^#\$ _HERE_=(.+)$", re.MULTILINE)


def toolkit_home(nvcc: str) -> str:
    """The toolkit ``nvcc`` runs from, as nvcc itself says (``--dryrun`` prints its
    ``_HERE_``, the folder of the real binary): an nvcc on PATH may be a wrapper script
    (``exec /usr/local/cuda-13.0/bin/nvcc "$@"`` in /usr/local/bin), whose own folder's parent
    is no toolkit. Falls back to the resolved path's grandparent."""
    done = proc.run(
        [nvcc, "--dryrun", "-E", "-x", "cu", os.devnull],
        tool="nvcc",
        env=proc.child_env(),
        check=False,
    )
    m = _HERE.search(done.stdout + done.stderr)
    if m and Path(m.group(1).strip(), "nvcc").is_file():
        return str(Path(m.group(1).strip()).resolve().parent)
    return str(Path(nvcc).resolve().parent.parent)


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


#: The arch-list build flags a build is checked for, and how the tool reading each spells it.
ARCH_FLAGS: tuple[tuple[str, ListFormat], ...] = (
    ("TORCH_CUDA_ARCH_LIST", "torch"),
    ("FLASH_ATTN_CUDA_ARCHS", "sm"),
)


def requested_archs(env: Mapping[str, str]) -> list[ArchRequest]:
    """The archs named by ``TORCH_CUDA_ARCH_LIST`` and ``FLASH_ATTN_CUDA_ARCHS``, read by
    :func:`envbuild.spec.archs.parse_list` as spec validation reads them.

    Raises ValueError naming the variable and the item when an item is one the build would
    refuse or misread.
    """
    out: list[ArchRequest] = []
    for variable, fmt in ARCH_FLAGS:
        found, bad = parse_list(variable, env.get(variable, ""), fmt)
        if bad:
            raise ValueError(f"{bad[0].message} ({bad[0].hint})")
        out += found
    return out


def unsupported(requests: list[ArchRequest], nvcc: Nvcc) -> list[ArchRequest]:
    """The requests ``nvcc`` cannot emit code for."""
    return [
        r
        for r in requests
        if (r.sass and not nvcc.can_compile(r.arch))
        or (r.ptx and not nvcc.can_compile(r.arch, ptx=True))
    ]


# --- MAX_JOBS --------------------------------------------------------------------------------


# --- a CUDA_HOME for a build --------------------------------------------------------------------

#: ``libcudart.so.13`` -> ``libcudart.so``: the dev link the linker's ``-lcudart`` looks for.
_SONAME = re.compile(r"^(lib[^/]+\.so)\.\d+$")


def assemble_cuda_home(toolkit: Path, site_packages: Sequence[Path], dest: Path) -> Path:
    """A toolkit folder for one build, made of links: the nvcc toolkit's ``bin`` and ``nvvm``,
    and ``include`` and ``lib64`` holding the toolkit's files and then those of the build venv's
    NVIDIA wheels (``site-packages/nvidia/*/include|lib``: cuBLAS, cuSPARSE, cuSOLVER …, whose
    headers torch's ``ATen/cuda`` headers include), the toolkit's winning a clash. NVIDIA's
    wheels ship ``libcudart.so.13`` but not the ``libcudart.so`` that torch's ``-lcudart``
    links against: each versioned library without one gets its unversioned link. A toolkit
    that is already whole (``/usr/local/cuda``) gains only what it lacks."""
    dest.mkdir(parents=True, exist_ok=True)
    for sub in ("bin", "nvvm"):
        if (toolkit / sub).is_dir() and not (dest / sub).exists():
            (dest / sub).symlink_to((toolkit / sub).resolve(), target_is_directory=True)
    nvidia = [p / "nvidia" for p in site_packages]
    roots = [toolkit, *sorted(d for n in nvidia if n.is_dir() for d in n.iterdir() if d.is_dir())]
    for sub, dirs in (("include", ("include",)), ("lib64", ("lib64", "lib"))):
        out = dest / sub
        out.mkdir(exist_ok=True)
        for root in roots:
            for name in dirs:
                folder = root / name
                if not folder.is_dir():
                    continue
                for entry in sorted(folder.iterdir()):
                    link = out / entry.name
                    if not link.exists() and not link.is_symlink():
                        link.symlink_to(entry.resolve())
    lib = dest / "lib64"
    for entry in sorted(lib.iterdir()):
        m = _SONAME.match(entry.name)
        if m and not (lib / m.group(1)).exists():
            (lib / m.group(1)).symlink_to(entry.resolve())
    return dest


# --- memory per compile job ---------------------------------------------------------------------


def cuda_home_script(python: str, toolkit: str, dest: str) -> str:
    """Shell lines that make :func:`assemble_cuda_home` of ``toolkit`` at ``dest`` with
    ``python`` (a builder container's interpreter: the build venv's NVIDIA wheels are its
    site-packages) and export it as ``CUDA_HOME``: the same function, run where the files are."""
    import inspect
    import shlex

    code = (
        "from __future__ import annotations\n"
        "import re, sys, sysconfig\n"
        "from pathlib import Path\n"
        "from collections.abc import Sequence\n"
        f"_SONAME = re.compile({_SONAME.pattern!r})\n"
        + inspect.getsource(assemble_cuda_home)
        + "assemble_cuda_home(Path(sys.argv[1]), [Path(sysconfig.get_paths()['purelib'])], "
        "Path(sys.argv[2]))\n"
    )
    return (
        f"{shlex.quote(python)} - {shlex.quote(toolkit)} {shlex.quote(dest)} <<'ENVBUILD_EOF'\n"
        f"{code}ENVBUILD_EOF\n"
        f"export CUDA_HOME={shlex.quote(dest)}\n"
    )
