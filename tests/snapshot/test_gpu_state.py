"""What verify and diff make of the GPU facts, with the real H200's answers replayed
(tests/fixtures/h200-nvml-*.json): who holds GPU memory is always shown, state (clocks,
temperature, power, memory in use) is shown and never counted, configuration (VBIOS, PCIe width,
power limit …) is drift, and an operator is warned about a narrow PCIe link or pending remaps."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.recordednvml import h200

from envbuild.snapshot import gpu, nvml
from envbuild.snapshot.model.core import load_snapshot
from envbuild.snapshot.model.gpu import GpuConfig, GpuSection

SCOPE = ("--no-docker", "--no-systemd", "--no-models")


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Set which recording the real-NVML class answers with: ``machine("idle")``; the process
    that held 20 GiB is this test's own (so its name is read from /proc)."""

    def use(moment: str, **edits: Any) -> None:
        def make() -> nvml.Nvml:
            lib = h200(moment, pids={473: os.getpid()})
            if edits:
                answers = lib.answers
                answers[("config", (0,))] = {**answers[("config", (0,))], **edits}
            return lib

        monkeypatch.setattr(gpu, "PyNvml", make)

    return use


def snap(cli: Any, out: Path) -> Path:
    result = cli("snapshot", *SCOPE, "-o", out)
    assert result.exit_code == 0, result.stderr
    return out


def test_verify_says_who_holds_gpu_memory_when_nothing_drifted(
    cli: Any, machine: Any, tmp_path: Path
) -> None:
    machine("idle")
    recorded = snap(cli, tmp_path / "idle.json")
    assert load_snapshot(recorded).gpu.gpus[0].memory_used_bytes == 0  # v2: not v1's 615 MiB
    machine("held")
    result = cli("verify", recorded)
    assert result.exit_code == 0, result.stdout
    lines = result.stdout.splitlines()
    assert lines[0] == f"no drift from {recorded}"
    assert lines[1] == "GPU memory in use now (state: shown, not counted):"
    comm = Path(f"/proc/{os.getpid()}/comm").read_text().strip()
    assert lines[2].startswith(
        "  gpu0: 20.6 GiB of 140.4 GiB used (+615.1 MiB reserved by the driver) by "
        f"pid {os.getpid()} {comm} ("
    ), lines
    assert lines[2].endswith(") 20.6 GiB")
    data = cli("verify", recorded, "--json")
    assert data.exit_code == 0
    assert data.stderr == ""  # --json in a pipe: no progress lines
    [held] = data.json()["gpu_memory"]
    assert (held["gpu"], held["used_bytes"], held["reserved_bytes"]) == (0, 22123708416, 644939776)
    assert [p["pid"] for p in held["processes"]] == [os.getpid()]
    assert data.json()["warnings"] == []
    # idle again: nothing to say
    machine("idle")
    assert cli("verify", recorded).stdout == f"no drift from {recorded}\n"


def test_gpu_state_is_shown_by_diff_and_never_counted(
    cli: Any, machine: Any, tmp_path: Path
) -> None:
    machine("idle")
    idle = snap(cli, tmp_path / "idle.json")
    machine("held")
    held = snap(cli, tmp_path / "held.json")
    result = cli("diff", idle, held)
    assert result.exit_code == 0, result.stdout
    lines = result.stdout.splitlines()
    assert "state (volatile: shown, not counted):" in lines
    assert "  gpu0 memory used: 0 B → 20.6 GiB" in lines
    assert (
        "  gpu0 clocks: graphics 345 MHz, mem 3201 MHz, sm 345 MHz → graphics 1980 MHz, mem "
        "3201 MHz, sm 1980 MHz"
    ) in lines
    assert "  gpu0 clocks limited by: gpu-idle → ∅" in lines
    assert "  gpu0 power draw: 77.119 W → 118.804 W" in lines
    data = cli("diff", idle, held, "--json").json()
    assert data["different"] is False
    assert [g["key"] for g in data["groups"]] == ["state"]


@pytest.mark.parametrize(
    ("edit", "line"),
    [
        ({"vbios_version": "96.00.A5.00.1B"}, "  gpu0 VBIOS: 96.00.A5.00.1A → 96.00.A5.00.1B"),
        ({"pcie_width": 8}, "  gpu0 PCIe width: x16 → x8"),
        ({"power_limit_w": 450.0}, "  gpu0 power limit: 700 W → 450 W"),
        ({"ecc_pending": False}, "  gpu0 ECC pending: on → off"),
        ({"remapped_rows_pending": True}, "  gpu0 row remapping pending: no → yes"),
        ({"application_clocks_mhz": {"graphics": 1500, "mem": 3201}},
         "  gpu0 application clocks: graphics 1980 MHz, mem 3201 MHz → graphics 1500 MHz, "
         "mem 3201 MHz"),
    ],
)  # fmt: skip
def test_a_gpu_configuration_change_is_drift(
    cli: Any, machine: Any, tmp_path: Path, edit: dict[str, Any], line: str
) -> None:
    machine("idle")
    recorded = snap(cli, tmp_path / "idle.json")
    machine("idle", **edit)
    result = cli("verify", recorded)
    assert result.exit_code == 1
    assert "GPU configuration:" in result.stdout.splitlines()
    assert line in result.stdout.splitlines()
    [group] = [g for g in cli("verify", recorded, "--json").json()["groups"]
               if g["key"] == "gpu config"]  # fmt: skip
    [change] = group["changes"]
    assert change["item"]["kind"] == "gpu setting" and change["item"]["gpu"] == 0
    assert change["item"]["uuid"].startswith("GPU-")


def test_verify_warns_about_a_narrow_pcie_link_and_pending_remaps(
    cli: Any, machine: Any, tmp_path: Path
) -> None:
    machine("idle", pcie_width=8, remapped_rows_pending=True)
    recorded = snap(cli, tmp_path / "bad.json")  # recorded as it is: no drift, but warnings
    result = cli("verify", recorded)
    assert result.exit_code == 0
    assert result.stdout.splitlines()[1:] == [
        "warning: gpu0: PCIe link trained at x8, below its maximum x16",
        "warning: gpu0: memory rows are waiting to be remapped: reset the GPU",
    ]
    assert len(cli("verify", recorded, "--json").json()["warnings"]) == 2


def test_gpu_warnings() -> None:
    section = gpu.read_gpus(h200("idle"), proc_root=Path("/nonexistent"))
    assert gpu.gpu_warnings(section) == []
    [card] = section.gpus
    odd = card.model_copy(
        update={
            "ecc_enabled": True,
            "config": GpuConfig(ecc_pending=False, mig_pending=True, remapped_rows_failure=True,
                                retired_pages_pending=True, pcie_width=16, pcie_max_width=16),
            "mig_enabled": False,
        }
    )  # fmt: skip
    assert gpu.gpu_warnings(GpuSection(available=True, gpus=[odd])) == [
        "gpu0: a memory row remapping failed: the GPU needs service",
        "gpu0: memory pages are waiting to be retired: reset the GPU",
        "gpu0: ECC changes to off at reset",
        "gpu0: MIG changes to on at reset",
    ]


def test_a_snapshot_from_before_the_gpu_configuration_is_not_drift(
    cli: Any, machine: Any, tmp_path: Path
) -> None:
    """A version-1 manifest has no GPU configuration or reserved memory: unknown, not changed."""
    machine("idle")
    new = snap(cli, tmp_path / "new.json")
    data = json.loads(new.read_text())
    data["schema_version"] = 1
    for card in data["gpu"]["gpus"]:
        del card["config"], card["state"], card["memory_reserved_bytes"]
    for env in data["pythons"]:
        del env["added"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    assert cli("verify", old).exit_code == 0
    assert cli("diff", old, new).exit_code == 0


def test_host_memory_and_free_disk_are_state(cli: Any, machine: Any, tmp_path: Path) -> None:
    """On some VMs the memory the kernel reports grows as it is used."""
    machine("idle")
    a = snap(cli, tmp_path / "a.json")
    data = json.loads(a.read_text())
    data["host"]["memory_total_bytes"] += 8 << 30
    for disk in data["host"]["disks"]:
        disk["free_bytes"] -= 200 << 20  # 44.8 GiB → 44.6 GiB between two snapshots
    b = tmp_path / "b.json"
    b.write_text(json.dumps(data))
    result = cli("diff", a, b)
    assert result.exit_code == 0
    assert any(line.startswith("  host memory: ") for line in result.stdout.splitlines())
    assert any(line.startswith("  free disk root /: ") for line in result.stdout.splitlines())


@given(cpus=st.sets(st.integers(0, 1023), max_size=64))
def test_cpu_lists_round_trip(cpus: set[int]) -> None:
    text = nvml.cpu_list(list(cpus))
    back: set[int] = set()
    for part in filter(None, text.split(",")):
        a, _, b = part.partition("-")
        back |= set(range(int(a), int(b or a) + 1))
    assert back == cpus
    words = [0] * 16
    for cpu in cpus:
        words[cpu // 64] |= 1 << (cpu % 64)
    assert nvml._cpu_list(words) == (text or None)


def test_snapshot_json_keeps_stderr_quiet_and_v_brings_progress_back(
    cli: Any, machine: Any, tmp_path: Path
) -> None:
    machine("held")
    quiet = cli("snapshot", *SCOPE, "--json")
    assert quiet.exit_code == 0 and quiet.stderr == ""
    assert quiet.json()["gpu"]["gpus"][0]["memory_reserved_bytes"] == 644939776
    loud = cli("-v", "snapshot", *SCOPE, "--json")
    assert "reading host and GPUs" in loud.stderr
    plain = cli("snapshot", *SCOPE, "-o", tmp_path / "s.json")
    assert "reading host and GPUs" in plain.stderr  # progress stays where no JSON is asked for
