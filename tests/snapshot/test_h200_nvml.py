"""The CI fake NVML answers what the real H200 answered (tests/fixtures/h200-nvml-*.json), and
every fact envbuild records from it agrees with `nvidia-smi -q -x` taken on the same machine at
the same moment (h200-nvidia-smi-idle.xml, -held.xml): idle, and with a process holding 20 GiB.
The recipe is tests/fixtures/h200-capture.sh."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.nvsmi import check_against_xml
from support.recordednvml import FIXTURES, h200

from envbuild.snapshot.gpu import read_gpus


@pytest.mark.parametrize("moment", ["idle", "held"])
def test_every_recorded_fact_of_the_real_h200_agrees_with_nvidia_smi(moment: str) -> None:
    section = read_gpus(h200(moment), proc_root=Path("/nonexistent"))
    check_against_xml(section, (FIXTURES / f"h200-nvidia-smi-{moment}.xml").read_text())


def test_used_memory_is_nvml_v2_without_the_drivers_reservation() -> None:
    """NVML v1 counts the driver's reservation as used (615 MiB on an idle H200, where
    nvidia-smi says 0); the snapshot records v2's used and reserved apart."""
    for moment in ("idle", "held"):
        lib = h200(moment)
        [raw] = lib.raw
        v1, v2 = raw["nvmlDeviceGetMemoryInfo"], raw["nvmlDeviceGetMemoryInfo_v2"]
        assert v1["used"] == v2["used"] + v2["reserved"]  # what the v1 call got wrong
        [gpu] = read_gpus(lib, proc_root=Path("/nonexistent")).gpus
        assert (gpu.memory_used_bytes, gpu.memory_reserved_bytes) == (v2["used"], v2["reserved"])
    idle = read_gpus(h200("idle"), proc_root=Path("/nonexistent")).gpus[0]
    assert idle.memory_used_bytes == 0 and idle.memory_reserved_bytes == 644939776
    held = read_gpus(h200("held"), proc_root=Path("/nonexistent")).gpus[0]
    [p] = held.processes
    assert p.used_memory_bytes == 22114467840  # 20 GiB asked, 21,090 MiB with the context


def test_the_recordings_were_made_on_the_same_h200_as_the_xml() -> None:
    for moment in ("idle", "held"):
        data = json.loads((FIXTURES / f"h200-nvml-{moment}.json").read_text())
        assert data["label"] == moment
        xml_text = (FIXTURES / f"h200-nvidia-smi-{moment}.xml").read_text()
        assert h200(moment).uuid(0) in xml_text
