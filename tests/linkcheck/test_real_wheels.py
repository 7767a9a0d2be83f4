"""The link check on real wheels from PyPI: torch 2.14.0 with its CUDA wheels is clean; wheels
built against an older torch and CUDA 12, that install next to it without a resolver conflict
(their metadata does not pin torch), are reported with the right library and symbols.

The environments (~5 GB each, hard links into uv's cache) are made once under
``$XDG_CACHE_HOME/envbuild-tests/linkcheck/`` with uv; slow and network-marked (a fresh machine
downloads ~3.5 GB of wheels): they run when ``ENVBUILD_TEST_TORCH=1`` (scripts/test, so CI, sets
it unless told 0) or once the environments are there.

* torchao 0.10.0 (``torchao/_C.abi3.so``): no torch requirement; built against torch 2.7 and
  CUDA 12 (``libcudart.so.12``).
* fbgemm-gpu 1.1.0: requires numpy only; built against torch 2.6 and CUDA 12.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from envbuild.linkcheck.core import check_folder
from envbuild.linkcheck.reader import Cache
from envbuild.proc import core as proc

pytestmark = [pytest.mark.network, pytest.mark.slow]


def _cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def _wanted() -> bool:
    """Asked for (``ENVBUILD_TEST_TORCH=1``: scripts/test sets it) or already made, unless
    ``ENVBUILD_TEST_TORCH=0``: a bare ``pytest`` does not download ~3.5 GB unasked."""
    asked = os.environ.get("ENVBUILD_TEST_TORCH")
    made = (_cache() / "envbuild-tests" / "linkcheck" / "torch-2.14.0" / ".complete").exists()
    return asked != "0" and (made or asked == "1")


if not _wanted():
    pytestmark.append(pytest.mark.skip(reason="set ENVBUILD_TEST_TORCH=1 (downloads ~3.5 GB)"))

SITE = "lib/python3.11/site-packages"


def env(name: str, *requirements: str) -> Path:
    root = _cache() / "envbuild-tests" / "linkcheck" / name
    done = root / ".complete"
    wanted = "\n".join(requirements)
    if done.exists() and done.read_text() == wanted:
        return root
    uv = proc.find_uv()
    environ = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    subprocess.run([uv, "venv", "-q", "--clear", "-p", "3.11", str(root)], check=True, env=environ)
    subprocess.run(
        [uv, "pip", "install", "-q", "--python", str(root / "bin" / "python"), *requirements],
        check=True,
        env=environ,
    )
    done.write_text(wanted)
    return root


@pytest.fixture(scope="module")
def torch_env() -> Path:
    return env("torch-2.14.0", "torch==2.14.0")


@pytest.fixture(scope="module")
def old_wheels_env() -> Path:
    return env("old-wheels", "torch==2.14.0", "torchao==0.10.0", "fbgemm-gpu==1.1.0")


def test_torch_and_its_cuda_wheels_report_nothing(torch_env: Path, tmp_path: Path) -> None:
    report = check_folder("/", str(torch_env), cache=Cache(tmp_path / "cache"))
    assert report.findings == [] and report.unreadable == {}
    assert report.checked > 100
    # the plugins no import loads (cuFile's RDMA, NVSHMEM's transports) are only noted
    assert {f.dist for f in report.optional} <= {"nvidia-cufile", "nvidia-nvshmem-cu13"}
    # and the dynamic linker agrees: torch's extension loads
    subprocess.run([str(torch_env / "bin" / "python"), "-c", "import torch"], check=True)


def test_wheels_built_against_an_older_torch_and_cuda(old_wheels_env: Path, tmp_path: Path) -> None:
    report = check_folder("/", str(old_wheels_env), cache=Cache(tmp_path / "cache"))
    site = f"{old_wheels_env}/{SITE}"
    by = {(f.file.removeprefix(site + "/"), f.kind): f for f in report.findings}
    assert {f.dist for f in report.findings} == {"torchao", "fbgemm-gpu"}

    lib = by["torchao/_C.abi3.so", "library"]
    assert lib.missing == ("libcudart.so.12",)
    assert "built against CUDA 12" in lib.cause and "libcudart.so.13" in lib.cause
    sym = by["torchao/_C.abi3.so", "symbols"]
    assert "c10::cuda::SetDevice(signed char)" in sym.demangled
    assert "_ZN3c104cuda9SetDeviceEa" in sym.missing
    assert sym.cause == "built against another torch than the locked 2.14.0"
    assert f"{site}/torch/lib/libc10_cuda.so" in sym.looked_in

    fb = by["fbgemm_gpu/fbgemm_gpu_py.so", "symbols"]
    assert "c10::MessageLogger::MessageLogger(char const*, int, int)" in fb.demangled
    assert by["fbgemm_gpu/fbgemm_gpu_py.so", "library"].missing == ("libcudart.so.12",)
    assert sym.id == "torchao:symbols" and lib.id == "torchao:libcudart.so.12"

    # the dynamic linker agrees, after `import torch` has loaded torch's libraries
    python = str(old_wheels_env / "bin" / "python")
    code = f"import ctypes, torch; ctypes.CDLL({site + '/torchao/_C.abi3.so'!r})"
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode != 0 and "libcudart.so.12" in done.stderr
