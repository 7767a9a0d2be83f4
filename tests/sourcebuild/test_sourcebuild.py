"""Source builds with real compilers: gcc for a C extension, nvcc for a CUDA kernel.

The build venvs get setuptools and wheel from PyPI (``network``); the fixtures' sdists are packed
from tests/cases/fixtures-src.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from sourcebuild.conftest import request, store_state

from envbuild.errors import ArchMissing, BuildFailed, ToolNotFound, UserError
from envbuild.proc import core as proc
from envbuild.sourcebuild.builder import HostBuilder
from envbuild.sourcebuild.jobs import choose_max_jobs
from envbuild.sourcebuild.realize import BuildResult, add_wheel, realize
from envbuild.sourcebuild.requests import FileRef
from envbuild.store.core import Store

GB = 10**9


def run_installed(store: Store, result: BuildResult, tmp: Path, code: str) -> str:
    """Install the stored wheel into a fresh venv and run ``code`` with it."""
    wheel = tmp / result.wheel
    wheel.write_bytes(store.blob_path(result.wheel_digest).read_bytes())
    uv = proc.find_uv()
    env = proc.child_env({"UV_PYTHON_DOWNLOADS": "never"})
    venv = tmp / f"venv-{result.key[:8]}"
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True, env=env)
    python = str(venv / "bin" / "python")
    install = [uv, "pip", "install", "-q", "--offline", "--no-deps", "--python", python, str(wheel)]
    subprocess.run(install, check=True, env=env, capture_output=True)
    done = subprocess.run([python, "-c", code], check=True, capture_output=True, text=True)
    return done.stdout.strip()


def build_log(store: Store, result: BuildResult) -> str:
    assert result.log_digest is not None
    return store.read_blob(result.log_digest).decode()


@pytest.mark.network
def test_c_extension_builds_once_and_the_flags_reach_gcc(
    sdists: Callable[[str], FileRef], store: Store, tmp_path: Path, python_version: str
) -> None:
    builder = HostBuilder(python_version)
    req = request(sdists("cext"), "fixture-cext", env={"CEXT_GREETING": "bonjour"})
    first = realize(req, builder, store)
    assert not first.reused and first.wheel.startswith("fixture_cext-1.0.0-cp3")
    assert [(f.path.split("/")[0], f.has_device_code) for f in first.audit.files] == [
        ("fixture_cext", False)
    ]
    assert first.max_jobs is not None and first.max_jobs >= 1  # chosen, and recorded
    out = run_installed(
        store, first, tmp_path, "import fixture_cext as m; print(m.greeting(), m.add(2, 3))"
    )
    assert out == "bonjour 5"
    again = realize(req, builder, store)
    assert again.reused and again.key == first.key and again.wheel_digest == first.wheel_digest
    assert store.derivations() == [first.key]

    changed = request(sdists("cext"), "fixture-cext", env={"CEXT_GREETING": "salut"})
    second = realize(changed, builder, store)
    assert not second.reused and second.previous == first.key
    assert [c.model_dump() for c in second.changes] == [
        {"key": "env.CEXT_GREETING", "old": "bonjour", "new": "salut", "item": False}
    ]
    out = run_installed(store, second, tmp_path, "import fixture_cext as m; print(m.greeting())")
    assert out == "salut"


@pytest.mark.network
def test_cuda_kernel_audit_matches_the_requested_archs(
    sdists: Callable[[str], FileRef], store: Store, tmp_path: Path, nvcc: str, python_version: str
) -> None:
    builder = HostBuilder(python_version)
    targets = ["8.0", "12.0"]
    pinned = {"MAX_JOBS": "3", "NVCC_THREADS": "2"}
    req = request(
        sdists("cudaext"),
        "fixture-cuda",
        env={"FLASH_ATTN_CUDA_ARCHS": "80;120", **pinned},
        target_ccs=targets,
    )
    first = realize(req, builder, store)
    assert (first.audit.sass, first.audit.ptx) == (["sm_80", "sm_120"], [])
    assert first.max_jobs == 3
    log = build_log(store, first)
    assert "-gencode arch=compute_80,code=sm_80 -gencode arch=compute_120,code=sm_120" in log
    # the pinned flags reached the compile step: nvcc ran with --threads 2, under MAX_JOBS=3
    (nvcc_line,) = [line for line in log.splitlines() if line.startswith("nvcc command")]
    assert nvcc_line.startswith("nvcc command (MAX_JOBS=3): ")
    assert " --threads 2 " in nvcc_line
    code = "import fixture_cuda as m; print(m.gencode())"
    assert run_installed(store, first, tmp_path, code) == (
        "-gencode arch=compute_80,code=sm_80 -gencode arch=compute_120,code=sm_120"
    )
    assert realize(req, builder, store).reused

    wider = request(
        sdists("cudaext"),
        "fixture-cuda",
        env={"FLASH_ATTN_CUDA_ARCHS": "80;90;120", **pinned},
        target_ccs=targets,
    )
    second = realize(wider, builder, store)
    assert not second.reused and second.previous == first.key
    assert [c.render() for c in second.changes] == [
        "env.FLASH_ATTN_CUDA_ARCHS: '80;120' -> '80;90;120'"
    ]
    assert second.audit.sass == ["sm_80", "sm_90", "sm_120"]

    torch_style = request(
        sdists("cudaext"),
        "fixture-cuda",
        env={"TORCH_CUDA_ARCH_LIST": "8.0;12.0+PTX", **pinned},
        target_ccs=targets,
    )
    third = realize(torch_style, builder, store)
    assert (third.audit.sass, third.audit.ptx) == (["sm_80", "sm_120"], ["compute_120"])
    assert {c.key for c in third.changes} == {
        "env.FLASH_ATTN_CUDA_ARCHS",
        "env.TORCH_CUDA_ARCH_LIST",
    }


@pytest.mark.network
def test_a_target_gpu_missing_from_the_wheel_fails(
    sdists: Callable[[str], FileRef], store: Store, nvcc: str, python_version: str
) -> None:
    before = store_state(store)
    req = request(
        sdists("cudaext"), "fixture-cuda", env={"FLASH_ATTN_CUDA_ARCHS": "80"}, target_ccs=["12.0"]
    )
    with pytest.raises(ArchMissing) as err:
        realize(req, HostBuilder(python_version), store)
    assert "no SASS or PTX for 12.0" in err.value.message
    assert "found SASS sm_80" in err.value.message
    assert store_state(store) == before


def test_an_arch_the_toolkit_cannot_compile(
    sdists: Callable[[str], FileRef], store: Store, nvcc: str, python_version: str
) -> None:
    req = request(
        sdists("cudaext"),
        "fixture-cuda",
        env={"FLASH_ATTN_CUDA_ARCHS": "70;120"},
        where="specs/x.toml:7",
    )
    with pytest.raises(UserError) as err:
        realize(req, HostBuilder(python_version), store)
    assert err.value.message.startswith("specs/x.toml:7: builds.fixture-cuda.env: nvcc 13.")
    assert "cannot compile FLASH_ATTN_CUDA_ARCHS='70' (sm_70)" in err.value.message
    assert err.value.hint and "sm_120" in err.value.hint
    assert store.derivations() == []


def test_missing_compilers(
    sdists: Callable[[str], FileRef], store: Store, tmp_path: Path, python_version: str
) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / f"python{python_version}").symlink_to(sys.executable)
    env = {"PATH": str(bare), "HOME": os.environ.get("HOME", "/root")}
    req = request(sdists("cext"), "fixture-cext")
    with pytest.raises(ToolNotFound) as err:
        realize(req, HostBuilder(sys.executable, base_env=env), store)
    assert err.value.message == "gcc (the host C/C++ compiler) was not found"
    cuda = request(sdists("cudaext"), "fixture-cuda", env={"FLASH_ATTN_CUDA_ARCHS": "120"})
    with pytest.raises(ToolNotFound) as nv:
        realize(
            cuda,
            HostBuilder(
                sys.executable, base_env={**os.environ, "ENVBUILD_NVCC": str(tmp_path / "nvcc")}
            ),
            store,
        )
    assert "ENVBUILD_NVCC" in nv.value.message
    assert store.derivations() == []


@pytest.mark.network
def test_a_failing_build_shows_the_log_tail(
    sdists: Callable[[str], FileRef], store: Store, python_version: str
) -> None:
    before = store_state(store)
    with pytest.raises(BuildFailed) as err:
        realize(request(sdists("broken"), "fixture-broken"), HostBuilder(python_version), store)
    assert err.value.message == "building fixture-broken 1.0.0 failed (exit status 2)"
    assert "this_symbol_does_not_exist" in err.value.output_tail
    assert "(the whole log: " in err.value.output_tail
    assert store_state(store) == before


def test_a_build_killed_for_memory_says_lower_max_jobs(
    sdists: Callable[[str], FileRef], store: Store, python_version: str
) -> None:
    before = store_state(store)
    req = request(sdists("oomkill"), "fixture-oomkill", env={"MAX_JOBS": "7"})
    with pytest.raises(BuildFailed) as err:
        realize(req, HostBuilder(python_version), store)
    assert "was killed (signal 9: out of memory?) with MAX_JOBS=7" in err.value.message
    assert err.value.hint and err.value.hint.startswith("lower MAX_JOBS (it was 7")
    assert "SIGKILL" in err.value.output_tail
    assert store_state(store) == before


def test_max_jobs_from_memory_and_cores() -> None:
    assert choose_max_jobs(4, memory=20 * GB, cores=16) == 2  # ~9 GB per job at 4 threads
    assert choose_max_jobs(2, memory=20 * GB, cores=16) == 4  # half the threads, half the memory
    assert choose_max_jobs(4, memory=200 * GB, cores=8) == 8  # never more jobs than cores
    assert choose_max_jobs(4, memory=1 * GB, cores=8) == 1  # at least one


@pytest.mark.network
def test_a_wheel_built_elsewhere_is_reused(
    sdists: Callable[[str], FileRef], tmp_path: Path, python_version: str
) -> None:
    builder = HostBuilder(python_version)
    req = request(sdists("cext"), "fixture-cext", env={"CEXT_GREETING": "from-elsewhere"})
    big_machine = Store(tmp_path / "big")
    built = realize(req, builder, big_machine)
    wheel = tmp_path / built.wheel
    wheel.write_bytes(big_machine.blob_path(built.wheel_digest).read_bytes())
    here = Store(tmp_path / "here")
    added = add_wheel(req, builder, here, wheel)
    assert added.origin == "added" and added.key == built.key
    reused = realize(req, builder, here)
    assert reused.reused and reused.origin == "added" and reused.wheel_digest == built.wheel_digest
    other = request(sdists("cudaext"), "fixture-cuda")
    with pytest.raises(UserError, match=r"not fixture-cuda 1\.0\.0 as locked"):
        add_wheel(other, builder, here, wheel)


def test_index_credentials_stay_secret() -> None:
    builder = HostBuilder("3.11", base_env={"PATH": "/usr/bin", "INDEX_TOKEN": "s3cret"})
    url = builder._expand("https://user:${INDEX_TOKEN}@index.example/simple")
    assert isinstance(url, proc.Secret) and str(url) == "***"
    assert url.reveal() == "https://user:s3cret@index.example/simple"
    assert builder._expand("https://pypi.org/simple") == "https://pypi.org/simple"
