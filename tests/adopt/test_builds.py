"""A distribution built on the machine (flash-attn compiled by hand) is a build, never a pin: its
[builds] entry says the archs its real device code holds (nvcc-compiled here, read by the fatbin
audit) in the flags the knowledge base says flash-attn's build reads, and the report names the
torch it links against."""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

import pytest
from adopt.conftest import make_venv, served
from support.sdists import pack_sdist
from support.wheels import make_wheel

from envbuild.adopt import Options, adopt
from envbuild.sourcebuild.toolchain import find_nvcc
from envbuild.store.core import Store

pytestmark = pytest.mark.slow

KERNEL = """
__global__ void add(float *a, int n) { int i = threadIdx.x; if (i < n) a[i] += 1; }
extern "C" int c10_answer(void);
extern "C" int launch(float *a, int n) { add<<<1, 32>>>(a, n); return c10_answer(); }
"""


@pytest.fixture(scope="module")
def nvcc() -> str:
    found = find_nvcc(required=False)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("CI must provide nvcc (scripts/test installs nvidia-cuda-nvcc)")
        pytest.skip("no nvcc here: install nvidia-cuda-nvcc or set ENVBUILD_NVCC")
    return found


def _extension(nvcc: str, work: Path) -> bytes:
    """A CUDA extension with sm_90 and sm_120 SASS, linked against a libc10.so."""
    work.mkdir(parents=True)
    (work / "c10.c").write_text("int c10_answer(void) { return 42; }\n")
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-Wl,-soname,libc10.so", "-o", work / "libc10.so",
         work / "c10.c"], check=True, capture_output=True,
    )  # fmt: skip
    (work / "k.cu").write_text(KERNEL)
    argv = [nvcc, "-shared", "-Xcompiler", "-fPIC", "-o", str(work / "ext.so"), str(work / "k.cu")]
    argv += ["-gencode", "arch=compute_90,code=sm_90", "-gencode", "arch=compute_120,code=sm_120"]
    argv += [f"-L{work}", "-lc10"]
    subprocess.run(argv, check=True, capture_output=True)
    return (work / "ext.so").read_bytes()


def test_a_locally_built_flash_attn_becomes_a_build_with_the_archs_it_holds(
    nvcc: str, repo: Path, tmp_path: Path
) -> None:
    ext = _extension(nvcc, tmp_path / "cc")
    published, local = tmp_path / "published", tmp_path / "local"
    version_py = "__version__ = '2.14.0+cu130'\ncuda = '13.0'\n"
    torch = make_wheel(
        published, "torch", "2.14.0", {"torch/__init__.py": "", "torch/version.py": version_py}
    )
    src = tmp_path / "src"
    (src / "flash_attn").mkdir(parents=True)
    (src / "flash_attn" / "__init__.py").write_text("")
    sdist = pack_sdist(src, "flash-attn", "2.8.3.post2", published)
    files = {"flash_attn/__init__.py": "", "flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so": ext}
    make_wheel(local, "flash-attn", "2.8.3.post2", files)
    (local / torch.name).write_bytes(torch.read_bytes())
    venv = make_venv(tmp_path / "hand", "torch", "flash-attn", find_links=local)
    with served([torch, sdist], tmp_path / "ix") as url:
        got = adopt(
            Options(str(venv), repo, name="fa", index_url=url, store=Store(tmp_path / "st"))
        )
    (build,) = got.rebuild
    assert (build.name, build.version, build.has_sdist) == ("flash-attn", "2.8.3.post2", True)
    assert build.sass == ["sm_90", "sm_120"] and build.ptx == []
    assert build.torch == "2.14.0+cu130"
    assert build.env == {
        "FLASH_ATTN_CUDA_ARCHS": "90;120",
        "TORCH_CUDA_ARCH_LIST": "9.0;12.0",
        "FLASH_ATTENTION_FORCE_BUILD": "TRUE",
    }
    assert any("rebuild needed: flash-attn 2.8.3.post2" in line for line in got.lines())
    spec = tomllib.loads((repo / "specs" / "fa.toml").read_text())
    assert spec["builds"] == {"flash-attn": {"version": "2.8.3.post2", "env": build.env}}
    assert spec["packages"] == {"torch": "==2.14.0"}
    lock = (repo / "lockfiles" / "pylock.fa.toml").read_text()
    assert 'name = "flash-attn"' in lock and "flash_attn-2.8.3.post2.tar.gz" in lock
