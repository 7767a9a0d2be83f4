"""The fatbin audit against real objects from nvcc (what runs where: tests/spec/test_archs.py)."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from envbuild.errors import InputFileError
from envbuild.sourcebuild.audit import (
    ObjectAudit,
    audit_file,
    audit_tree,
    audit_wheel,
)
from envbuild.sourcebuild.toolchain import find_cuobjdump

KERNEL = """
__global__ void add(float *a, const float *b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] += b[i];
}
extern "C" void launch(float *a, const float *b, int n) { add<<<(n + 255) / 256, 256>>>(a, b, n); }
"""

#: (nvcc -gencode values, SASS expected, PTX expected)
CASES = [
    (["arch=compute_75,code=sm_75"], ["sm_75"], []),
    (["arch=compute_80,code=sm_80", "arch=compute_90,code=sm_90"], ["sm_80", "sm_90"], []),
    (["arch=compute_120,code=compute_120"], [], ["compute_120"]),
    (
        ["arch=compute_80,code=sm_80", "arch=compute_120,code=[sm_120,compute_120]"],
        ["sm_80", "sm_120"],
        ["compute_120"],
    ),
    (["arch=compute_100,code=sm_100", "arch=compute_120,code=sm_121"], ["sm_100", "sm_121"], []),
    (
        ["arch=compute_90a,code=sm_90a", "arch=compute_100a,code=compute_100a"],
        ["sm_90a"],
        ["compute_100a"],
    ),
    (
        ["arch=compute_120f,code=sm_120f", "arch=compute_100f,code=compute_100f"],
        ["sm_120f"],
        ["compute_100f"],
    ),
    (["arch=compute_86,code=sm_86", "arch=compute_89,code=sm_89"], ["sm_86", "sm_89"], []),
]


def _compile(nvcc: str, tmp: Path, gencodes: list[str], *extra: str, shared: bool = False) -> Path:
    src = tmp / "k.cu"
    src.write_text(KERNEL)
    out = tmp / ("k.so" if shared else "k.o")
    argv = [nvcc, "-shared" if shared else "-c", "-Xcompiler", "-fPIC", *extra]
    for g in gencodes:
        argv += ["-gencode", g]
    subprocess.run([*argv, str(src), "-o", str(out)], check=True, capture_output=True)
    return out


@pytest.mark.parametrize(("gencodes", "sass", "ptx"), CASES, ids=lambda v: str(v))
def test_audit_reports_exactly_the_requested_archs(
    nvcc: str, tmp_path: Path, gencodes: list[str], sass: list[str], ptx: list[str]
) -> None:
    obj = _compile(nvcc, tmp_path, gencodes)
    audit = audit_file(obj)
    assert (audit.sass, audit.ptx, audit.lto) == (sass, ptx, [])
    if tool := find_cuobjdump():  # CI installs nvidia-cuda-cuobjdump: the reference reader
        ref = audit_file(obj, tool=tool)
        # cuobjdump names a family-specific cubin by its plain arch (sm_120f -> sm_120)
        assert ref.sass == [s.removesuffix("f") for s in sass]
        assert ref.ptx == ptx


def test_shared_library_compressed_rdc_debug_and_lto(nvcc: str, tmp_path: Path) -> None:
    so = _compile(
        nvcc,
        tmp_path,
        ["arch=compute_80,code=sm_80", "arch=compute_120,code=[sm_120,compute_120]"],
        shared=True,
    )
    assert audit_file(so).model_dump() == {
        "path": "k.so",
        "sass": ["sm_80", "sm_120"],
        "ptx": ["compute_120"],
        "lto": [],
    }
    (tmp_path / "c").mkdir()
    compressed = _compile(
        nvcc, tmp_path / "c", ["arch=compute_75,code=sm_75"], "-Xfatbin=-compress-all", "-G"
    )
    assert audit_file(compressed).sass == ["sm_75"]
    (tmp_path / "r").mkdir()
    rdc = _compile(nvcc, tmp_path / "r", ["arch=compute_90,code=sm_90"], "-rdc=true")
    assert audit_file(rdc).sass == ["sm_90"]  # in __nv_relfatbin, not .nv_fatbin
    (tmp_path / "l").mkdir()
    lto = audit_file(_compile(nvcc, tmp_path / "l", ["arch=compute_90,code=lto_90"], "-rdc=true"))
    assert (lto.sass, lto.ptx, lto.lto) == ([], [], ["lto_90"])
    assert lto.missing(["9.0"]) == ["9.0"]  # LTO-IR never runs by itself


def test_host_only_files_and_wheels(nvcc: str, tmp_path: Path) -> None:
    gpu = _compile(nvcc, tmp_path, ["arch=compute_90,code=sm_90"], shared=True)
    host = tmp_path / "host.so"
    (tmp_path / "h.c").write_text("int f(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", str(tmp_path / "h.c"), "-o", str(host)], check=True)
    wheel = tmp_path / "x-1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(gpu, "x/_gpu.so")
        zf.write(host, "x/_host.so")
        zf.writestr("x/__init__.py", "")
    audit = audit_wheel(wheel)
    assert [(f.path, f.sass) for f in audit.files] == [("x/_gpu.so", ["sm_90"]), ("x/_host.so", [])]
    assert audit.missing(["9.0"]) == {}
    assert audit.missing(["12.0", "9.0"]) == {"x/_gpu.so": ["12.0"]}
    tree = tmp_path / "tree"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tree)
    assert audit_tree(tree) == audit


def test_not_an_object(tmp_path: Path) -> None:
    bogus = tmp_path / "x.so"
    bogus.write_text("not elf")
    with pytest.raises(InputFileError, match="not an ELF file"):
        audit_file(bogus)


def test_missing_explains_how_each_gpu_runs() -> None:
    audit = ObjectAudit(path="f.so", sass=["sm_80", "sm_90a"], ptx=["compute_90"])
    assert audit.runs_on("8.9") == "sm_80 SASS"
    assert audit.runs_on("9.0") == "sm_90a SASS"
    assert audit.runs_on("12.0") == "compute_90 PTX (JIT)"
    assert audit.runs_on("7.5") is None
    assert audit.missing(["7.5", "8.0", "12.0"]) == ["7.5"]


def test_find_cuobjdump_beside_nvcc(tmp_path: Path) -> None:
    assert find_cuobjdump(env={"ENVBUILD_CUOBJDUMP": "/opt/cuobjdump"}) == "/opt/cuobjdump"
    bin_dir = tmp_path / "cuda" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("nvcc", "cuobjdump"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    assert find_cuobjdump(env={"ENVBUILD_NVCC": str(bin_dir / "nvcc")}) == str(
        bin_dir / "cuobjdump"
    )
