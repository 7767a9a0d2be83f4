"""CUDA toolkits on the machine: every ``nvcc`` found, its version and where it is; and the CUDA
libraries installed system-wide (cuDNN, as ``python -m torch.utils.collect_env`` looks for it)."""

from __future__ import annotations

import glob
import logging
import os
import re
import shutil
from collections.abc import Iterable

from envbuild.errors import EnvironmentFailure
from envbuild.proc import core as proc
from envbuild.snapshot.model.host import CudaLibrary, CudaToolkit

log = logging.getLogger(__name__)

_RELEASE = re.compile(r"release (?P<version>[0-9.]+), V(?P<build>[0-9.]+)")


def candidates(env: dict[str, str] | None = None) -> list[str]:
    """nvcc binaries: $CUDA_HOME, $CUDA_PATH, PATH, /usr/local/cuda*, /opt/cuda*, /usr/bin."""
    env = dict(os.environ) if env is None else env
    found: list[str] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            found.append(os.path.join(env[var], "bin", "nvcc"))
    on_path = shutil.which("nvcc", path=env.get("PATH"))
    if on_path:
        found.append(on_path)
    for pattern in ("/usr/local/cuda*/bin/nvcc", "/opt/cuda*/bin/nvcc", "/usr/bin/nvcc"):
        found.extend(sorted(glob.glob(pattern)))
    return found


def read_toolkits(paths: Iterable[str] | None = None) -> list[CudaToolkit]:
    seen: dict[str, CudaToolkit] = {}
    for path in candidates() if paths is None else paths:
        real = os.path.realpath(path)
        if real in seen or not os.access(real, os.X_OK) or not os.path.isfile(real):
            continue
        try:
            out = proc.run([real, "--version"], tool="nvcc", env=proc.child_env(), timeout=60)
        except (EnvironmentFailure, OSError) as exc:
            log.warning("%s --version failed: %s", real, exc)
            continue
        match = _RELEASE.search(out.stdout)
        if match is None:
            log.warning("%s --version said nothing recognisable", real)
            continue
        seen[real] = CudaToolkit(path=real, version=match["version"], build=match["build"])
    return sorted(seen.values(), key=lambda t: t.path)


#: Where system-wide CUDA libraries are (Debian/Ubuntu multiarch, RPM, NVIDIA's toolkit).
LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/local/cuda/lib64",
    "/usr/local/cuda/targets/x86_64-linux/lib",
)
_LIBRARY = re.compile(r"^(?P<name>libcudnn(?:_[a-z_]+)?)\.so\.(?P<version>\d+\.\d+\.\d+)$")


def read_libraries(dirs: Iterable[str] = LIBRARY_DIRS) -> list[CudaLibrary]:
    """The fully versioned system cuDNN libraries (``libcudnn.so.9.14.0``) in ``dirs``; the
    ones a venv's wheels carry are its distributions (nvidia-cudnn-cu13)."""
    found: dict[str, CudaLibrary] = {}
    for folder in dirs:
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            m = _LIBRARY.match(name)
            path = os.path.join(folder, name)
            real = os.path.realpath(path)
            if m and real not in found and os.path.isfile(real):
                found[real] = CudaLibrary(name=m["name"], version=m["version"], path=path)
    return sorted(found.values(), key=lambda lib: lib.path)
