"""The toolchain probe a builder container runs: its Python, gcc, g++ and (asked ``cuda``) nvcc.

:class:`envbuild.sourcebuild.container.ContainerBuilder` pipes this file's text into the image's
own interpreter (``python - [cuda]``); envbuild is not installed there, so it imports nothing but
the standard library. It prints one line, ``ENVBUILD-PROBE `` and a JSON object with sorted keys:
``python`` (``platform.python_version()``), ``gcc`` and ``g++`` (``-dumpfullversion``, None when
the compiler is missing) and, for ``cuda``, ``nvcc``: the first nvcc found (``$ENVBUILD_NVCC``,
``$CUDA_HOME``/``$CUDA_PATH``, PATH, ``/usr/local/cuda``, NVIDIA's nvcc wheels in the venv) with
the output of ``--version``, ``--list-gpu-code`` and ``--list-gpu-arch``, which
:func:`envbuild.sourcebuild.toolchain.parse_nvcc` reads on this side, or None.

It starts its processes with :mod:`subprocess` itself, the one module of envbuild that does not
go through :mod:`envbuild.proc`: it runs inside the builder container, where envbuild is not
installed, so it cannot import envbuild.proc. What proc gives is had all the same: the
container's own process (started through proc, in a process group envbuild stops on a signal)
holds these children, and their argvs are fixed (a compiler's path and a version flag, no spec
value), so there is nothing to quote or redact. tests/test_argv_audit.py lists it as the known
exception, with this reason.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import shutil
import subprocess
import sys

PREFIX = "ENVBUILD-PROBE "


def version(tool: str) -> str | None:
    """``tool``'s full version, "unknown" when it prints none, None when it is not on PATH."""
    found = shutil.which(tool)
    if not found:
        return None
    done = subprocess.run(
        [found, "-dumpfullversion", "-dumpversion"], capture_output=True, text=True, check=False
    )
    out = done.stdout.strip()
    return out.splitlines()[0] if out else "unknown"


def nvcc() -> dict[str, str] | None:
    """The first executable nvcc and what it says of itself, or None."""
    candidates = [os.environ.get("ENVBUILD_NVCC", "")]
    candidates += [
        os.path.join(os.environ.get(v, ""), "bin", "nvcc")
        for v in ("CUDA_HOME", "CUDA_PATH")
        if os.environ.get(v)
    ]
    candidates += [shutil.which("nvcc") or "", "/usr/local/cuda/bin/nvcc"]
    candidates += sorted(
        glob.glob(
            os.path.join(
                sys.prefix, "lib", "python*", "site-packages", "nvidia", "cu*", "bin", "nvcc"
            )
        )
    )
    for path in candidates:
        if path and os.access(path, os.X_OK) and os.path.isfile(path):

            def run(*args: str, path: str = path) -> str:
                return subprocess.run(
                    [path, *args], capture_output=True, text=True, check=False
                ).stdout

            return {
                "path": path,
                "version": run("--version"),
                "codes": run("--list-gpu-code"),
                "archs": run("--list-gpu-arch"),
            }
    return None


def main(argv: list[str]) -> None:
    """Print the probe's line; ``argv`` ``["cuda"]`` probes nvcc too."""
    out: dict[str, object] = {
        "python": platform.python_version(),
        "gcc": version(os.environ.get("CC", "gcc")),
        "g++": version(os.environ.get("CXX", "g++")),
    }
    if argv == ["cuda"]:
        out["nvcc"] = nvcc()
    print(PREFIX + json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1:])
