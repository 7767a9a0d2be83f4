"""GPUs: the real NVML where there is none (here, CI), a fake subclass of the NVML interface for
the assembly, the real H200 snapshot checked against nvidia-smi from the same machine, and — on
a machine with a GPU — a live snapshot checked against a live nvidia-smi."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from support.nvsmi import check_against_xml

from envbuild.snapshot.gpu import read_gpus, unit_of_pid
from envbuild.snapshot.model.core import load_snapshot
from envbuild.snapshot.model.gpu import GpuSection
from envbuild.snapshot.nvml import GpuUnavailable, Nvml, PyNvml

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
MIB = 1 << 20


def nvml_works() -> bool:
    lib = PyNvml()
    try:
        lib.open()
    except GpuUnavailable:
        return False
    lib.close()
    return True


def check_against_nvidia_smi(section: GpuSection, xml_text: str, csv_text: str) -> int:
    """Every fact nvidia-smi also reports must agree. Returns the number of GPUs checked."""
    root = ET.fromstring(xml_text)
    assert section.available
    assert section.driver_version == root.findtext("driver_version")
    assert section.cuda_driver_version == root.findtext("cuda_version")
    cards = root.findall("gpu")
    assert len(section.gpus) == len(cards) > 0
    caps = {}
    for line in csv_text.strip().splitlines()[1:]:
        cells = [c.strip() for c in line.split(",")]
        caps[cells[2]] = cells[5]  # uuid -> compute_cap
    for gpu, card in zip(section.gpus, cards, strict=True):
        assert gpu.name == card.findtext("product_name")
        assert gpu.uuid == card.findtext("uuid")
        assert gpu.pci_bus_id is not None and gpu.pci_bus_id.lower() == card.get("id", "").lower()
        total = card.findtext("fb_memory_usage/total")
        assert total is not None and total.endswith(" MiB")
        assert gpu.memory_total_bytes // MIB == int(total.split()[0])
        assert gpu.compute_capability == caps[gpu.uuid]
        assert gpu.persistence_mode == (card.findtext("persistence_mode") == "Enabled")
        assert gpu.ecc_enabled == (card.findtext("ecc_mode/current_ecc") == "Enabled")
        mig = card.findtext("mig_mode/current_mig")
        assert gpu.mig_enabled == (None if mig in (None, "N/A") else mig == "Enabled")
        smi_pids = {int(p.findtext("pid") or -1) for p in card.findall("processes/process_info")}
        assert {p.pid for p in gpu.processes} == smi_pids
    return len(cards)


# --- no driver (here and on CI) --------------------------------------------------------------


@pytest.mark.skipif(nvml_works(), reason="this machine has an NVIDIA driver")
def test_without_a_driver_the_gpu_section_says_why(cli: Any, tmp_path: Path) -> None:
    section = read_gpus()
    assert section.available is False
    assert section.reason and "NVML" in section.reason
    assert section.gpus == [] and section.driver_version is None
    out = tmp_path / "s.json"
    result = cli("snapshot", "--no-docker", "--no-systemd", "--no-models", "-o", out)
    assert result.exit_code == 0, result.stderr
    assert "GPUs: not available (NVML:" in result.stdout
    assert load_snapshot(out).gpu.available is False


# --- the assembly, with a fake NVML (no GPU here) --------------------------------------------


class TwoLinkedGpus(Nvml):
    """Two H200s joined by NVLink; one process (ours) on GPU 1."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.closed = False

    def open(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def driver_version(self) -> str:
        return "580.159.04"

    def cuda_driver_version(self) -> int:
        return 13000

    def nvml_version(self) -> str | None:
        return "13.580.159.04"

    def count(self) -> int:
        return 2

    def name(self, i: int) -> str:
        return "NVIDIA H200"

    def uuid(self, i: int) -> str:
        return f"GPU-{i:08d}"

    def pci_bus_id(self, i: int) -> str | None:
        return f"00000000:0{i}:00.0"

    def compute_capability(self, i: int) -> tuple[int, int]:
        return (9, 0)

    def memory(self, i: int) -> tuple[int, int, int | None]:
        return (143771 * MIB, 70 * 1024 * MIB if i else 0, 616 * MIB)

    def processes(self, i: int) -> list[tuple[int, int | None]]:
        return [(self.pid, 70 * 1024 * MIB)] if i else []

    def persistence(self, i: int) -> bool | None:
        return True

    def ecc(self, i: int) -> bool | None:
        return True

    def mig(self, i: int) -> bool | None:
        return None

    def nvlinks_active(self, i: int) -> int | None:
        return 18

    def link(self, i: int, j: int) -> str:
        return "nvlink"


def test_gpus_processes_units_and_links_are_assembled(tmp_path: Path) -> None:
    proc_root = tmp_path / "proc"
    (proc_root / "4242").mkdir(parents=True)
    (proc_root / "4242" / "cgroup").write_text("0::/system.slice/vllm-llama.service\n")
    (proc_root / "4242" / "comm").write_text("vllm\n")
    lib = TwoLinkedGpus(4242)
    section = read_gpus(lib, proc_root=proc_root)
    assert lib.closed
    assert (section.driver_version, section.cuda_driver_version) == ("580.159.04", "13.0")
    assert [g.uuid for g in section.gpus] == ["GPU-00000000", "GPU-00000001"]
    [p] = section.gpus[1].processes
    assert (p.pid, p.name, p.unit, p.used_memory_bytes) == (
        4242,
        "vllm",
        "vllm-llama.service",
        70 << 30,
    )
    assert [(t.a, t.b, t.link) for t in section.topology] == [(0, 1, "nvlink")]


def test_the_unit_of_a_real_process_is_read_from_its_cgroup() -> None:
    # this process: whatever its cgroup says, the answer is a unit name or None, never an error
    unit = unit_of_pid(os.getpid())
    assert unit is None or unit.endswith((".service", ".scope"))
    assert unit_of_pid(2**22 + 7) is None  # no such process


@pytest.mark.parametrize(
    ("cgroup", "unit"),
    [
        ("0::/system.slice/vllm-glm5.service\n", "vllm-glm5.service"),
        (
            "0::/user.slice/user-1000.slice/user@1000.service/app.slice/vllm.service\n",
            "vllm.service",
        ),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", "session-3.scope"),
        ("12:memory:/docker/abc\n0::/\n", None),
    ],
)
def test_unit_of_pid_reads_cgroup_v1_and_v2(tmp_path: Path, cgroup: str, unit: str | None) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cgroup").write_text(cgroup)
    assert unit_of_pid(7, tmp_path) == unit


# --- the real H200 ---------------------------------------------------------------------------


def test_the_h200_snapshot_agrees_with_nvidia_smi_from_the_same_machine() -> None:
    snap = load_snapshot(FIXTURES / "h200-snapshot.json")
    checked = check_against_nvidia_smi(
        snap.gpu,
        (FIXTURES / "h200-nvidia-smi.xml").read_text(),
        (FIXTURES / "h200-nvidia-smi.csv").read_text(),
    )
    assert checked == 1
    [gpu] = snap.gpu.gpus
    assert (gpu.name, gpu.compute_capability) == ("NVIDIA H200", "9.0")
    assert snap.gpu.driver_version is not None and snap.gpu.driver_version.startswith("580.")
    assert snap.taken_at is not None and snap.taken_at.startswith("2026-")


@pytest.mark.skipif(
    not nvml_works() or shutil.which("nvidia-smi") is None, reason="needs an NVIDIA GPU"
)
def test_live_snapshot_agrees_with_live_nvidia_smi() -> None:
    """Runs where there is a GPU (the device machine), not on CI."""
    xml_text = subprocess.run(
        ["nvidia-smi", "-q", "-x"], check=True, capture_output=True, text=True
    ).stdout
    csv_text = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,name,uuid,driver_version,memory.total,compute_cap",
         "--format=csv"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    section = read_gpus()
    assert check_against_nvidia_smi(section, xml_text, csv_text) >= 1
    check_against_xml(section, xml_text)  # every fact, memory used and reserved included


def topo_matrix(text: str) -> dict[tuple[int, int], str]:
    """`nvidia-smi topo -m`: GPU rows and columns → NV#/PIX/PXB/PHB/NODE/SYS."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    lines = text.splitlines()
    header = [c for c in lines[0].split("\t") if re.fullmatch(r"GPU\d+", c.strip())]
    out = {}
    for row in (line.split("\t") for line in lines[1:] if re.match(r"GPU\d+\t", line)):
        i = int(row[0].removeprefix("GPU"))
        for j, cell in enumerate(row[1 : 1 + len(header)]):
            out[(i, j)] = cell.strip()
    return out


_PCIE = {"PIX": "pcie-switch", "PXB": "pcie-switches", "PHB": "pcie-hostbridge",
         "NODE": "numa-node", "SYS": "system"}  # fmt: skip


def test_the_two_h200s_links_agree_with_nvidia_smi_topo() -> None:
    """A real two-GPU machine (nvidia-h200-x2): NVML's view against `nvidia-smi topo -m`."""
    snap = load_snapshot(FIXTURES / "h200x2-snapshot.json")
    assert (
        check_against_nvidia_smi(
            snap.gpu,
            (FIXTURES / "h200x2-nvidia-smi.xml").read_text(),
            (FIXTURES / "h200x2-nvidia-smi.csv").read_text(),
        )
        == 2
    )
    matrix = topo_matrix((FIXTURES / "h200x2-topo.txt").read_text())
    assert {(t.a, t.b) for t in snap.gpu.topology} == {(0, 1)}
    for link in snap.gpu.topology:
        cell = matrix[(link.a, link.b)]
        if cell.startswith("NV"):
            assert link.link == "nvlink"
            assert snap.gpu.gpus[link.a].nvlinks_active == int(cell[2:])
        else:
            assert link.link == _PCIE[cell]


class OldPynvml:
    """An nvidia-ml-py that knows only the oldest calls, on a GPU that supports few of them."""

    class NVMLError(Exception):
        pass

    NVML_FEATURE_ENABLED = 1
    NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM, NVML_CLOCK_MEM = 0, 1, 2
    NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC = 0, 1
    NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
    NVML_TEMPERATURE_GPU = 0

    def nvmlDeviceGetHandleByIndex(self, i: int) -> object:
        return ("handle", i)

    def nvmlDeviceGetMemoryInfo(self, h: object, version: object = None) -> object:
        assert version is None  # an nvidia-ml-py without nvmlMemory_v2 never asks for v2
        return type("M", (), {"total": 8 << 30, "used": 1 << 30})()

    def nvmlDeviceGetTemperature(self, h: object, sensor: int) -> int:
        return 41

    def nvmlDeviceGetEccMode(self, h: object) -> tuple[int, int]:
        raise self.NVMLError("Not Supported")

    def nvmlDeviceGetClockInfo(self, h: object, clock: int) -> int:
        return {0: 1200, 1: 1200, 2: 5000}[clock]


def test_an_old_nvidia_ml_py_gives_what_it_can_and_no_error() -> None:
    lib = PyNvml()
    lib._nv = OldPynvml()
    assert lib.memory(0) == (8 << 30, 1 << 30, None)  # v1 only: used includes the reservation
    config = lib.config(0)
    assert config.ecc_pending is None and config.vbios_version is None
    assert config.max_clocks_mhz == {} and config.pcie_width is None
    state = lib.state(0)
    assert state.temperature_c == 41
    assert state.clocks_mhz == {"graphics": 1200, "sm": 1200, "mem": 5000}
    assert state.performance_state is None and state.ecc_errors == {}
