"""What the real flash-attn build taught, without compiling it: MAX_JOBS and NVCC_THREADS are not
in the key, MAX_JOBS comes from a memory model (and a pinned one that does not fit is warned
about), the knowledge base's sdist patch (C++20 for torch >= 2.13) is keyed and applied, and the
CUDA_HOME a build gets is whole (the wheels' headers and libraries, ``libcudart.so``)."""

from __future__ import annotations

import io
import logging
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sourcebuild.conftest import request
from support.recordingbuilder import RecordingBuilder
from support.wheels import make_wheel

from envbuild.errors import InputFileError, IntegrityError, ToolNotFound, UserError
from envbuild.fsio import sha256_file
from envbuild.sourcebuild.builder import Toolchain
from envbuild.sourcebuild.inputs import SdistPatch, inputs_of, sdist_patches
from envbuild.sourcebuild.jobs import job_memory, plan_jobs
from envbuild.sourcebuild.realize import realize
from envbuild.sourcebuild.requests import FileRef, SourceBuildRequest, TorchRef
from envbuild.sourcebuild.sdist import patch_sdist
from envbuild.sourcebuild.toolchain import (
    Nvcc,
    assemble_cuda_home,
    check_toolkit,
    nvcc_info,
    toolkit_home,
)
from envbuild.spec.knowledge import build_memory
from envbuild.store.core import Store, derivation_key

NVCC = Nvcc(path="/cuda/bin/nvcc", version="13.0.88", sass=("sm_120",), ptx=("compute_120",))
TOOLCHAIN = Toolchain(
    python="3.11.9", compilers={"gcc": "12.2.0", "g++": "12.2.0", "nvcc": "13.0.88"}, nvcc=NVCC
)
TORCH = TorchRef(
    version="2.14.0", wheel="torch-2.14.0-cp311-cp311-linux_x86_64.whl", sha256="0" * 64
)
GB = 10**9


def recording(wheel: Path) -> RecordingBuilder:
    return RecordingBuilder(wheel, TOOLCHAIN)


def flash(sdist: FileRef, env: dict[str, str], **kw: object) -> SourceBuildRequest:
    return request(sdist, "flash-attn", version="2.8.3.post2", env=env, **kw)


def key(req: SourceBuildRequest) -> str:
    return derivation_key("source-build", inputs_of(req, TOOLCHAIN, recording(Path())))


ARCHS = {"FLASH_ATTN_CUDA_ARCHS": "120", "TORCH_CUDA_ARCH_LIST": "12.0"}


# --- MAX_JOBS and NVCC_THREADS are not inputs ---------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    jobs=st.none() | st.integers(1, 512).map(str), threads=st.none() | st.integers(1, 64).map(str)
)
def test_speed_flags_never_change_the_key(
    sdists: Callable[[str], FileRef], jobs: str | None, threads: str | None
) -> None:
    sdist = sdists("cext")
    speed = {k: v for k, v in (("MAX_JOBS", jobs), ("NVCC_THREADS", threads)) if v is not None}
    assert key(flash(sdist, {**ARCHS, **speed})) == key(flash(sdist, ARCHS))


def test_an_arch_changes_the_key_and_the_flags_still_reach_the_build(
    sdists: Callable[[str], FileRef], tmp_path: Path
) -> None:
    sdist = sdists("cext")
    pinned = flash(sdist, {**ARCHS, "MAX_JOBS": "16", "NVCC_THREADS": "4"})
    assert key(flash(sdist, {**ARCHS, "FLASH_ATTN_CUDA_ARCHS": "90;120"})) != key(pinned)
    store = Store(tmp_path / "store")
    builder = recording(make_wheel(tmp_path / "out", "flash-attn", "2.8.3.post2", {}))
    first = realize(pinned, builder, store)
    (job,) = builder.jobs
    assert (job.env["MAX_JOBS"], job.env["NVCC_THREADS"]) == ("16", "4")
    assert first.max_jobs == 16
    # the glm5 spec's 16 x 4 and this machine's 2 x 1 are one derivation
    again = realize(flash(sdist, {**ARCHS, "MAX_JOBS": "2", "NVCC_THREADS": "1"}), builder, store)
    assert again.reused and again.key == first.key and len(builder.jobs) == 1


# --- MAX_JOBS from the memory model -------------------------------------------------------------


def test_the_model_of_flash_attn_is_in_the_knowledge_base_with_its_source() -> None:
    fact = build_memory("flash-attn", "2.8.3.post2")
    assert fact is not None and "measured" in fact.source and "bench/flashattn.py" in fact.source
    one = job_memory(4, 1, gb_base=fact.gb_base, gb_per_arch=fact.gb_per_arch)
    four = job_memory(4, 4, gb_base=fact.gb_base, gb_per_arch=fact.gb_per_arch)
    # the measured peak of one sm_120 job, and more archs at once cost more per job
    assert 5 * GB <= one.per_job_bytes <= 8 * GB < four.per_job_bytes
    assert (
        job_memory(1, 4, gb_base=fact.gb_base, gb_per_arch=fact.gb_per_arch).per_job_bytes
        == one.per_job_bytes
    )
    assert job_memory(2, 4, gb_base=1, gb_per_arch=2).per_job_bytes == 5 * GB
    assert job_memory(4, 0).per_job_bytes == 9 * GB  # no model: flash-attn's own rule


def test_unpinned_max_jobs_is_what_fits(sdists: Callable[[str], FileRef]) -> None:
    req = flash(sdists("cext"), {**ARCHS, "NVCC_THREADS": "4"})
    plan = plan_jobs(req, memory=24 * GB, cores=2)
    assert not plan.pinned and plan.archs == 1 and plan.max_jobs == 2 and plan.fits
    assert plan.warning() is None
    assert plan_jobs(req, memory=24 * GB, cores=64).max_jobs == 24 * GB // plan.per_job_bytes
    assert plan_jobs(req, memory=GB, cores=64).max_jobs == 1  # at least one


def test_a_pinned_max_jobs_that_does_not_fit_is_warned_at_build_start(
    sdists: Callable[[str], FileRef], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # glm5-gguf pins 16 x 4 threads; on a 2-core 24 GB builder that is ~48 GB for 1 arch
    req = flash(sdists("cext"), {**ARCHS, "MAX_JOBS": "16", "NVCC_THREADS": "4"})
    plan = plan_jobs(req, memory=24 * GB, cores=2)
    assert plan.pinned and plan.max_jobs == 16 and not plan.fits
    text = plan.warning()
    assert text is not None
    assert f"MAX_JOBS=16 x NVCC_THREADS=4 needs about {16 * plan.per_job_bytes / GB:.1f} GB" in text
    assert "24.0 GB is available" in text and "a safe value here is MAX_JOBS=2" in text
    builder = recording(make_wheel(tmp_path / "out", "flash-attn", "2.8.3.post2", {}))
    with caplog.at_level(logging.WARNING, logger="envbuild.sourcebuild.jobs"):
        realize(req, builder, Store(tmp_path / "store"), memory=24 * GB)
    (warned,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "MAX_JOBS=16 x NVCC_THREADS=4 needs about" in warned.getMessage()
    assert builder.jobs[0].env["MAX_JOBS"] == "16"  # warned, not overridden: the spec decides


# --- the sdist patch of the knowledge base ------------------------------------------------------


def test_cxx20_patch_is_keyed_only_for_torch_that_needs_it(
    sdists: Callable[[str], FileRef],
) -> None:
    sdist = sdists("cext")
    new = flash(sdist, ARCHS, torch=TORCH)
    (patch,) = sdist_patches(new)
    assert patch.name == "flash-attn-2.8.3.post2-cxx20.patch"
    assert inputs_of(new, TOOLCHAIN, recording(Path()))["source_patches"] == [patch.model_dump()]
    old = flash(sdist, ARCHS, torch=TORCH.model_copy(update={"version": "2.12.1"}))
    assert sdist_patches(old) == [] and "source_patches" not in inputs_of(
        old, TOOLCHAIN, recording(Path())
    )
    assert sdist_patches(flash(sdist, ARCHS)) == []  # no torch: nothing to match
    other = request(sdist, "fixture-cext", torch=TORCH)
    assert sdist_patches(other) == []


def _sdist(where: Path, files: dict[str, bytes], name: str = "pkg-1.0.tar.gz") -> Path:
    path = where / name
    with tarfile.open(path, "w:gz") as tar:
        for member, data in files.items():
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


PATCH = b"""a header line patch ignores
--- a/setup.py
+++ b/setup.py
@@ -1,3 +1,3 @@
 flags = [
-    "-std=c++17",
+    "-std=c++20",
 ]
"""


def test_patch_sdist_applies_exactly_and_repacks(tmp_path: Path) -> None:
    folder = tmp_path / "patches"
    folder.mkdir()
    (folder / "p.patch").write_bytes(PATCH)
    setup = b'flags = [\n    "-std=c++17",\n]\n'
    sdist = _sdist(tmp_path, {"pkg-1.0/setup.py": setup, "pkg-1.0/PKG-INFO": b"Name: pkg\n"})
    ref = SdistPatch(name="p.patch", sha256=sha256_file(folder / "p.patch"))
    work = tmp_path / "work"
    work.mkdir()
    out = patch_sdist(sdist, [ref], work, folder=folder)
    assert out.name == sdist.name and out != sdist
    with tarfile.open(out) as tar:
        got = tar.extractfile("pkg-1.0/setup.py")
        assert got is not None and b"-std=c++20" in got.read()
        assert "pkg-1.0/PKG-INFO" in tar.getnames()
    assert patch_sdist(sdist, [], work, folder=folder) == sdist

    again = tmp_path / "again"
    again.mkdir()
    patched = _sdist(tmp_path, {"pkg-1.0/setup.py": setup.replace(b"17", b"20")}, "b.tar.gz")
    with pytest.raises(UserError, match=r"p\.patch"):  # already applied: exactly or not at all
        patch_sdist(patched, [ref], again, folder=folder)

    changed = tmp_path / "changed"
    changed.mkdir()
    with pytest.raises(IntegrityError, match="the build's key holds"):
        patch_sdist(sdist, [ref.model_copy(update={"sha256": "1" * 64})], changed, folder=folder)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    member=st.sampled_from(["../evil", "/abs/evil", "a/../../evil", "pkg-1.0/../../evil"])
    | st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=30)
)
def test_patch_sdist_of_a_hostile_tar_writes_nothing_outside(
    tmp_path_factory: pytest.TempPathFactory, member: str
) -> None:
    where = tmp_path_factory.mktemp("hostile")
    folder = where / "patches"
    folder.mkdir()
    (folder / "p.patch").write_bytes(PATCH)
    ref = SdistPatch(name="p.patch", sha256=sha256_file(folder / "p.patch"))
    try:
        sdist = _sdist(where, {member: b"x"})
    except (ValueError, UnicodeEncodeError):
        return  # not a name a tar can hold
    work = where / "work"
    work.mkdir()
    before = sorted(p.relative_to(where) for p in where.rglob("*") if "work" not in p.parts)
    with pytest.raises((InputFileError, UserError)):
        patch_sdist(sdist, [ref], work, folder=folder)
    after = sorted(p.relative_to(where) for p in where.rglob("*") if "work" not in p.parts)
    assert after == before


@pytest.mark.network
def test_the_cxx20_patch_applies_to_the_real_sdist(tmp_path: Path) -> None:
    """The locked flash_attn-2.8.3.post2.tar.gz (8 MB from PyPI): the patch applies with no
    fuzz and leaves no -std=c++17 in the CUDA flags."""
    from envbuild.lock.core import lock_path
    from envbuild.lock.io import read_lock
    from envbuild.sourcebuild.inputs import SOURCE_PATCHES
    from envbuild.sourcebuild.sdist import fetch_sdist
    from envbuild.spec.load import load_spec

    repo = Path(__file__).resolve().parents[2]
    lock = read_lock(lock_path(load_spec(repo / "specs" / "glm5-gguf.toml")))
    locked = lock.build("flash-attn")
    assert locked is not None
    ref = FileRef(name=locked.sdist.name, url=locked.sdist.url, sha256=locked.sdist.hashes.sha256)
    sdist = fetch_sdist(ref, tmp_path)
    (patch,) = sdist_patches(flash(ref, ARCHS, torch=TORCH))
    out = patch_sdist(sdist, [patch], tmp_path, folder=SOURCE_PATCHES)
    with tarfile.open(out) as tar:
        member = tar.extractfile("flash_attn-2.8.3.post2/setup.py")
        assert member is not None
        text = member.read().decode()
    cuda_part = text[text.index("nvcc_flags = [") : text.index("ext_modules.append(")]
    assert '"-std=c++20"' in cuda_part and "-std=c++17" not in cuda_part


# --- the toolkit a build gets ------------------------------------------------------------------


def _touch(path: Path, data: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data)
    return path


def test_cuda_home_joins_the_toolkit_and_the_venvs_nvidia_wheels(tmp_path: Path) -> None:
    toolkit = tmp_path / "cu13"
    _touch(toolkit / "bin" / "nvcc")
    _touch(toolkit / "nvvm" / "bin" / "cicc")
    _touch(toolkit / "include" / "cuda_runtime.h", "toolkit")
    _touch(toolkit / "include" / "cccl" / "nv" / "target")
    _touch(toolkit / "lib" / "libcudart.so.13")
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    _touch(site / "nvidia" / "cu13" / "include" / "cublas_v2.h")
    _touch(site / "nvidia" / "cu13" / "include" / "cuda_runtime.h", "wheel")
    _touch(site / "nvidia" / "cu13" / "lib" / "libcublas.so.13")
    _touch(site / "nvidia" / "cudnn" / "include" / "cudnn.h")
    _touch(site / "nvidia" / "cudnn" / "lib" / "libcudnn.so.9")
    home = assemble_cuda_home(toolkit, [site], tmp_path / "work" / "cuda")
    assert (home / "bin" / "nvcc").is_file() and (home / "nvvm" / "bin" / "cicc").is_file()
    assert (home / "include" / "cuda_runtime.h").read_text() == "toolkit"  # the toolkit wins
    assert (home / "include" / "cublas_v2.h").is_file()
    assert (home / "include" / "cudnn.h").is_file()
    assert (home / "include" / "cccl" / "nv" / "target").is_file()
    lib = home / "lib64"
    # the unversioned links torch's -lcudart (and -lcublas …) link against
    assert (lib / "libcudart.so").resolve() == (toolkit / "lib" / "libcudart.so.13").resolve()
    assert (lib / "libcublas.so").is_file() and (lib / "libcudnn.so").is_file()
    assert assemble_cuda_home(toolkit, [site], home) == home  # again: nothing clashes


def test_a_toolkit_without_cccl_is_refused_before_building(tmp_path: Path) -> None:
    toolkit = tmp_path / "cu13"
    nvcc = _touch(toolkit / "bin" / "nvcc")
    _touch(toolkit / "nvvm" / "bin" / "cicc")
    _touch(toolkit / "include" / "crt" / "host_config.h")
    _touch(toolkit / "include" / "cuda_runtime.h")
    info = Nvcc(path=str(nvcc), version="13.0.88", sass=("sm_120",), ptx=("compute_120",))
    with pytest.raises(ToolNotFound) as err:
        check_toolkit(info)
    assert "include/cccl/nv/target of the CUDA toolkit" in err.value.message
    assert err.value.hint and "nvidia-cuda-cccl==13.0.*" in err.value.hint
    _touch(toolkit / "include" / "cccl" / "nv" / "target")
    check_toolkit(info)


def test_an_nvcc_wrapper_on_path_leads_to_the_real_toolkit(tmp_path: Path, nvcc: str) -> None:
    """/usr/local/bin/nvcc may be `exec /usr/local/cuda-13.0/bin/nvcc "$@"`: its folder's
    parent (/usr/local) is no toolkit; nvcc's own --dryrun names the real one."""
    wrapper = tmp_path / "bin" / "nvcc"
    _touch(wrapper, f'#!/bin/sh\nexec {nvcc} "$@"\n').chmod(0o755)
    real = nvcc_info(nvcc).cuda_home
    found = nvcc_info(str(wrapper))
    assert found.path == str(wrapper) and found.cuda_home == real != str(tmp_path)
    assert toolkit_home(str(wrapper)) == real
    check_toolkit(found)  # the real toolkit is whole (scripts/test installs CCCL too)


def test_ninjas_lines_are_logged_as_progress(caplog: pytest.LogCaptureFixture) -> None:
    from envbuild.sourcebuild.builder import NinjaProgress

    now = [0.0]
    progress = NinjaProgress("flash-attn 2.8.3.post2", clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="envbuild.sourcebuild.builder"):
        for t, line in [
            (60, "[1/73] c++ -MMD -MF flash_api.o.d ... -c flash_api.cpp\n"),
            (90, "warning: something else\n"),
            (600, "[2/73] /tmp/cuda/bin/nvcc ... -c flash_bwd_hdim128_bf16_sm80.cu\n"),
            (600, "[2/73] printed twice\n"),
            (900, "  [3/73] indented: not ninja's\n"),
        ]:
            now[0] = t
            progress(line)
    assert [r.getMessage() for r in caplog.records] == [
        "flash-attn 2.8.3.post2: 1/73 objects compiled (1 min, 1.0 min each so far)",
        "flash-attn 2.8.3.post2: 2/73 objects compiled (10 min, 5.0 min each so far)",
    ]


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=40) | st.from_regex(r"\s*\d{1,4}(\.\d{1,3})?\s*[kKmMgGtT]?i?[bB]?\s*"))
def test_a_memory_budget_is_a_positive_size_or_a_clear_error(text: str) -> None:
    from envbuild.sourcebuild.jobs import parse_size

    try:
        value = parse_size(text)
    except ValueError as exc:
        assert repr(text) in str(exc)
    else:
        assert isinstance(value, int) and value > 0


def test_envbuild_build_memory_caps_what_max_jobs_is_chosen_from(
    sdists: Callable[[str], FileRef], monkeypatch: pytest.MonkeyPatch
) -> None:
    from envbuild.errors import UsageError
    from envbuild.sourcebuild.jobs import build_memory_budget, parse_size

    assert parse_size("12GiB") == 12 * 2**30 and parse_size("12G") == parse_size("12GB") == 12 * GB
    monkeypatch.setattr("envbuild.sourcebuild.jobs.available_memory_bytes", lambda: 24 * GB)
    assert build_memory_budget({}) == 24 * GB
    assert build_memory_budget({"ENVBUILD_BUILD_MEMORY": "12GiB"}) == 12 * 2**30
    assert build_memory_budget({"ENVBUILD_BUILD_MEMORY": "64GB"}) == 24 * GB  # never above free
    req = flash(sdists("cext"), {**ARCHS, "NVCC_THREADS": "4"})
    monkeypatch.setenv("ENVBUILD_BUILD_MEMORY", "12GiB")  # a shared machine's share
    plan = plan_jobs(req, cores=2)
    assert plan.memory_bytes == 12 * 2**30 and plan.max_jobs == 1 and plan.fits
    monkeypatch.setenv("ENVBUILD_BUILD_MEMORY", "lots")
    with pytest.raises(UsageError, match="ENVBUILD_BUILD_MEMORY: 'lots' is not a size"):
        plan_jobs(req, cores=2)


def test_the_container_builder_makes_the_same_cuda_home_where_the_files_are(
    tmp_path: Path,
) -> None:
    """The lines a builder container runs (toolchain.cuda_home_script), run here by bash with
    this Python: the same links as assemble_cuda_home, and CUDA_HOME exported."""
    import subprocess
    import sys

    from envbuild.sourcebuild.toolchain import cuda_home_script

    toolkit = tmp_path / "site" / "nvidia" / "cu13"
    _touch(toolkit / "bin" / "nvcc")
    _touch(toolkit / "include" / "cublas_v2.h")
    _touch(toolkit / "lib" / "libcudart.so.13")
    dest = tmp_path / "cuda home"  # a space: every path is quoted
    script = cuda_home_script(sys.executable, str(toolkit), str(dest))
    done = subprocess.run(
        ["bash", "-euc", script + 'echo "CUDA_HOME=$CUDA_HOME"'],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(f"CUDA_HOME={dest}")
    assert (dest / "bin" / "nvcc").is_file() and (dest / "include" / "cublas_v2.h").is_file()
    assert (dest / "lib64" / "libcudart.so").resolve() == (toolkit / "lib" / "libcudart.so.13")
