"""Compile src/fixture_cuda/_kernel.cu with nvcc for the archs the build flags name."""

import os
import shlex
import shutil
import subprocess
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def gencode_flags():
    flags = []
    for item in os.environ.get("FLASH_ATTN_CUDA_ARCHS", "").split(";"):
        item = item.strip()
        if item:  # flash-attn's form: 80;90;120
            flags += ["-gencode", f"arch=compute_{item},code=sm_{item}"]
    for item in os.environ.get("TORCH_CUDA_ARCH_LIST", "").replace(" ", ";").split(";"):
        item = item.strip()
        if not item:
            continue  # torch's form: 8.0;9.0a;12.0+PTX
        number = item.removesuffix("+PTX").replace(".", "")
        flags += ["-gencode", f"arch=compute_{number},code=sm_{number}"]
        if item.endswith("+PTX"):
            flags += ["-gencode", f"arch=compute_{number},code=compute_{number}"]
    if not flags:
        raise SystemExit("set FLASH_ATTN_CUDA_ARCHS or TORCH_CUDA_ARCH_LIST")
    return flags


def find_nvcc():
    home = os.environ.get("CUDA_HOME")
    if home and Path(home, "bin", "nvcc").is_file():
        return str(Path(home, "bin", "nvcc"))
    found = shutil.which("nvcc")
    if not found:
        raise SystemExit("nvcc not found: set CUDA_HOME")
    return found


class NvccBuildExt(build_ext):
    def build_extension(self, ext):
        flags = gencode_flags()
        gen = Path(self.build_temp) / "gen"
        gen.mkdir(parents=True, exist_ok=True)
        (gen / "fixture_gencode.h").write_text(
            "#define FIXTURE_GENCODE " + '"' + " ".join(flags) + '"\n'
        )
        out = Path(self.get_ext_fullpath(ext.name))
        out.parent.mkdir(parents=True, exist_ok=True)
        threads = os.environ.get("NVCC_THREADS", "1")
        cmd = [
            find_nvcc(),
            "-shared",
            "-O2",
            "-Xcompiler",
            "-fPIC",
            "--threads",
            threads,
            *flags,
            "-I",
            str(gen),
            "-I",
            sysconfig.get_paths()["include"],
            "-o",
            str(out),
            *ext.sources,
        ]
        # MAX_JOBS is what torch's cpp_extension gives ninja; one kernel needs one job, but the
        # log shows the value the compile step ran with
        jobs = os.environ.get("MAX_JOBS", "unset")
        print(f"nvcc command (MAX_JOBS={jobs}): " + shlex.join(cmd), flush=True)
        subprocess.check_call(cmd)


setup(
    ext_modules=[Extension("fixture_cuda._kernel", ["src/fixture_cuda/_kernel.cu"])],
    cmdclass={"build_ext": NvccBuildExt},
)
