"""torch's own `python -m torch.utils.collect_env` as an anchor: every fact it reports about the
GPU stack of the H200 machine (driver, CUDA runtime, cuDNN, GPU models, torch build) is in the
snapshot taken there minutes apart (tests/fixtures/h200-collect-env.txt, h200-snapshot-held.json,
made by h200-capture-3.sh); and that snapshot agrees with nvidia-smi -q -x taken with it."""

from __future__ import annotations

import re
from pathlib import Path

from support.nvsmi import check_against_xml

from envbuild.snapshot.model.core import load_snapshot

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SNAPSHOT = FIXTURES / "h200-snapshot-held.json"


def collect_env() -> dict[str, str]:
    text = (FIXTURES / "h200-collect-env.txt").read_text()
    facts = dict(re.findall(r"^([A-Za-z][^:\n]+): (.*)$", text, re.M))
    cudnn = text.split("cuDNN version: Probably one of the following:\n", 1)[1]
    facts["cuDNN files"] = "\n".join(
        line for line in cudnn.splitlines() if line.startswith("/")
    )  # the lines up to the next fact
    return facts


def test_every_gpu_stack_fact_of_collect_env_is_in_the_snapshot() -> None:
    env = collect_env()
    snap = load_snapshot(SNAPSHOT)
    # the driver
    assert env["Nvidia driver version"] == snap.gpu.driver_version
    # the GPU models
    models = re.findall(r"GPU (\d+): ([^\n]+)", env["GPU models and configuration"])
    assert [(int(i), name) for i, name in models] == [(g.index, g.name) for g in snap.gpu.gpus]
    # CUDA runtime (collect_env asks nvcc) and the CUDA torch was built with
    assert env["CUDA runtime version"] in {t.build for t in snap.cuda_toolkits}
    [python] = snap.pythons
    assert python.torch_build is not None
    assert env["PyTorch version"] == python.torch_build.version == "2.11.0+cu130"
    assert env["CUDA used to build PyTorch"] == python.torch_build.cuda
    assert env["Is debug build"] == str(python.torch_build.debug)
    torch = next(d for d in python.distributions if d.name == "torch")
    assert python.torch_build.version.split("+")[0] == torch.version
    # cuDNN: the system libraries collect_env lists, each recorded with its version
    assert snap.cuda_libraries is not None
    recorded = {lib.path: lib.version for lib in snap.cuda_libraries}
    listed = env["cuDNN files"].splitlines()
    assert listed and all(recorded.get(path) == path.rsplit(".so.", 1)[1] for path in listed)
    # ... and the one torch loads, from its wheel (torch.backends.cudnn.version() 91900)
    assert "torch 2.11.0+cu130 cuda 13.0 cudnn 91900" in (FIXTURES / "h200-capture.log").read_text()
    cudnn = next(d for d in python.distributions if d.name == "nvidia-cudnn-cu13")
    assert cudnn.version.startswith("9.19.0")
    # the Python and the OS
    assert env["Python version"].startswith(python.version)
    assert env["OS"].startswith(snap.host.os.pretty_name or "?")


def test_the_snapshot_agrees_with_nvidia_smi_taken_with_it() -> None:
    snap = load_snapshot(SNAPSHOT)
    check_against_xml(snap.gpu, (FIXTURES / "h200-nvidia-smi-snapshot.xml").read_text())
    [gpu] = snap.gpu.gpus
    [p] = gpu.processes
    assert p.used_memory_bytes is not None and p.used_memory_bytes > 20 << 30  # the holder
    assert gpu.memory_reserved_bytes == 644939776


def test_system_cudnn_is_found_by_its_versioned_files(tmp_path: Path) -> None:
    from envbuild.snapshot.cuda import read_libraries

    names = ("libcudnn.so.9.14.0", "libcudnn_ops.so.9.14.0", "libcudnn.so.9", "libfoo.so.1.2.3")
    for name in names:
        (tmp_path / name).write_bytes(b"\x7fELF")
    (tmp_path / "libcudnn.so").symlink_to("libcudnn.so.9.14.0")
    found = read_libraries([str(tmp_path), str(tmp_path / "missing")])
    assert [(lib.name, lib.version) for lib in found] == [("libcudnn", "9.14.0"),
                                                         ("libcudnn_ops", "9.14.0")]  # fmt: skip
