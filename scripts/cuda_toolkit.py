#!/usr/bin/env python3
"""Install the CUDA compiler a spec's source builds need, from NVIDIA's wheels on PyPI (for CI).

    python scripts/cuda_toolkit.py SPEC DEST            # prints ENVBUILD_NVCC=... (or nothing)
    python scripts/cuda_toolkit.py SPEC DEST --dry-run  # prints the requirements only

Nothing is installed and nothing printed when none of the spec's ``[builds]`` compiles CUDA code.
Otherwise a venv at DEST gets a toolkit tree under ``site-packages/nvidia/cu13`` that a torch
extension build (flash-attn) can use as ``CUDA_HOME``:

* the compiler at the spec's ``[cuda] version`` (else torch's CUDA variant): ``nvidia-cuda-nvcc``,
  ``nvidia-cuda-crt`` (nvcc's crt headers), ``nvidia-nvvm`` (cicc, libdevice),
  ``nvidia-cuda-runtime`` (cudart) and ``nvidia-cuda-cccl`` (CUB/Thrust/libcu++, which nvcc.profile
  adds as ``include/cccl``);
* the headers torch's own headers include (``ATen/cuda/CUDAContextLight.h``: cublas, cublasLt,
  cusparse, cusolverDn; curand), at the lock's versions, the ones torch runs with;
* the two links the wheels cannot carry: ``lib64 -> lib`` (nvcc.profile and torch's
  cpp_extension look in ``$CUDA_HOME/lib64``) and ``libcudart.so -> libcudart.so.13`` (the
  extension links ``-lcudart``).

The install honours the lock's ``exclude-newer``, so a rerun picks the same wheels. This is what
``scripts/test`` does for the test suite's compiler, for a whole torch extension build.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from envbuild.lock.core import lock_path
from envbuild.lock.io import read_lock
from envbuild.lock.model import Lock
from envbuild.proc import core as proc
from envbuild.sourcebuild.requests import build_requests
from envbuild.spec import load_spec
from envbuild.spec.load import LoadedSpec

TOOLKIT = ("nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm", "nvidia-cuda-runtime",
           "nvidia-cuda-cccl")  # fmt: skip
HEADERS = ("nvidia-cublas", "nvidia-cusparse", "nvidia-cusolver", "nvidia-curand")


def cuda_release(loaded: LoadedSpec) -> str:
    """``13.1`` from ``[cuda] version``, else from ``[torch] cuda = "cu130"``."""
    spec = loaded.spec
    if spec.cuda is not None:
        return ".".join(spec.cuda.version.split(".")[:2])
    variant = spec.torch.cuda if spec.torch is not None else "cpu"
    if not variant.startswith("cu"):
        raise SystemExit(f"{loaded.root}: no [cuda] version and torch is not a CUDA build")
    return f"{variant[2:-1]}.{variant[-1]}"


def requirements(loaded: LoadedSpec, lock: Lock) -> list[str]:
    """What to install for ``loaded``'s source builds; empty when none compiles CUDA code."""
    if not any(r.needs_cuda for r in build_requests(loaded, lock)):
        return []
    release = cuda_release(loaded)
    out = [f"{name}=={release}.*" for name in TOOLKIT]
    for name in HEADERS:
        if (pkg := lock.package(name)) is not None:
            out.append(f"{name}=={pkg.version}")
    return out


def install(dest: Path, reqs: list[str], exclude_newer: str) -> Path:
    """A venv at ``dest`` holding ``reqs``; returns its nvcc."""
    uv = proc.find_uv()
    env = proc.child_env({"UV_PYTHON_DOWNLOADS": "never"})
    if not (dest / "bin" / "python").exists():
        proc.run([uv, "venv", "--quiet", "--python", sys.executable, str(dest)], tool="uv", env=env)
    proc.run(
        [uv, "pip", "install", "--quiet", "--python", str(dest / "bin" / "python"),
         "--exclude-newer", exclude_newer, *reqs],
        tool="uv",
        env=env,
    )  # fmt: skip
    homes = sorted(dest.glob("lib/python3*/site-packages/nvidia/cu*/bin/nvcc"))
    if not homes:
        raise SystemExit(f"{dest}: the wheels laid out no nvidia/cu*/bin/nvcc")
    home = homes[-1].parent.parent
    if not (home / "lib64").exists():
        (home / "lib64").symlink_to("lib")
    cudart = sorted((home / "lib").glob("libcudart.so.*"))
    if cudart and not (home / "lib" / "libcudart.so").exists():
        (home / "lib" / "libcudart.so").symlink_to(cudart[0].name)
    return homes[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path)
    parser.add_argument("dest", type=Path)
    parser.add_argument("--dry-run", action="store_true", help="print the requirements only")
    args = parser.parse_args(argv)
    loaded = load_spec(args.spec)
    lock = read_lock(lock_path(loaded))
    reqs = requirements(loaded, lock)
    if args.dry_run:
        for line in reqs:
            print(line)
        return 0
    if reqs:
        nvcc = install(args.dest.absolute(), reqs, lock.envbuild.exclude_newer.isoformat())
        print(f"ENVBUILD_NVCC={nvcc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
