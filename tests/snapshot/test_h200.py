"""The real H200 snapshot (tests/fixtures/h200-snapshot.json, made by h200-snapshot.sh on the
device machine): diffed against edited copies, and verified against this machine (no GPU)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.recordednvml import h200

from envbuild.snapshot import gpu
from envbuild.snapshot.nvml import GpuUnavailable, PyNvml

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "h200-snapshot.json"


def edited(tmp_path: Path, name: str, edit: Any) -> Path:
    data = json.loads(FIXTURE.read_text())
    edit(data)
    out = tmp_path / name
    out.write_text(json.dumps(data))
    return out


def torch_of(data: dict[str, Any]) -> dict[str, Any]:
    [env] = data["pythons"]
    return next(d for d in env["distributions"] if d["name"] == "torch")


def test_the_fixture_is_equal_to_itself(cli: Any) -> None:
    result = cli("diff", FIXTURE, FIXTURE)
    assert result.exit_code == 0
    assert result.stdout == f"no differences between {FIXTURE} and {FIXTURE}\n"


def test_driver_package_and_file_changes_are_grouped(cli: Any, tmp_path: Path) -> None:
    def change(data: dict[str, Any]) -> None:
        data["gpu"]["driver_version"] = "580.200.01"
        data["gpu"]["cuda_driver_version"] = "13.1"
        torch = torch_of(data)
        torch["version"] = "2.12.0"
        torch["size_bytes"] += 3 * 2**20
        torch["modified"] = [{"path": "torch/nn/functional.py", "reason": "size",
                              "expected_size": 100, "actual_size": 120}]  # fmt: skip

    b = edited(tmp_path, "b.json", change)
    result = cli("diff", FIXTURE, b)
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    old = json.loads(FIXTURE.read_text())
    driver = old["gpu"]["driver_version"]
    assert "driver, CUDA and GPUs:" in lines
    assert f"  driver: {driver} → 580.200.01" in lines
    assert "  CUDA driver API: 13.0 → 13.1" in lines
    assert f"  torch: {torch_of(old)['version']} → 2.12.0, +3.0 MiB" in lines
    assert "  torch/nn/functional.py (torch): ∅ → differs from RECORD (size 100 → 120 B)" in lines
    data = cli("diff", FIXTURE, b, "--json").json()
    [torch_change] = [c for g in data["groups"] if g["key"].startswith("packages ")
                      for c in g["changes"] if c["subject"] == "torch"]  # fmt: skip
    assert torch_change["item"] == {"kind": "package", "environment": "/opt/torch/.venv",
                                    "name": "torch"}  # fmt: skip
    assert torch_change["before_fields"]["version"] == torch_of(old)["version"]
    assert torch_change["after_fields"]["version"] == "2.12.0"
    assert torch_change["delta_bytes"] == 3 * 2**20
    assert [g["title"].split(" (")[0] for g in data["groups"]] == [
        "driver, CUDA and GPUs", "packages", "files that differ from their RECORD"
    ]  # fmt: skip


def test_volatile_state_is_shown_but_not_counted(cli: Any, tmp_path: Path) -> None:
    def load(data: dict[str, Any]) -> None:
        gpu = data["gpu"]["gpus"][0]
        gpu["memory_used_bytes"] = 120 * 2**30
        gpu["processes"] = [{"pid": 777, "name": "vllm", "used_memory_bytes": 118 * 2**30,
                             "unit": "vllm-glm5.service"}]  # fmt: skip
        data["taken_at"] = "2027-01-01T00:00:00Z"

    result = cli("diff", FIXTURE, edited(tmp_path, "busy.json", load))
    assert result.exit_code == 0
    assert "  gpu0 process 777: ∅ → vllm (vllm-glm5.service), 118.0 GiB" in result.stdout
    assert "taken_at" not in result.stdout


class NoDriver(PyNvml):
    """A machine without an NVIDIA driver, wherever the test runs (CI, or the H200 itself)."""

    def open(self) -> None:
        raise GpuUnavailable("NVML: NVML Shared Library Not Found")


def gone_venv(tmp_path: Path) -> Path:
    """The fixture with its venv moved to a path that is surely not on this machine (the
    device machine has /opt/torch/.venv, where the fixture was taken)."""
    gone = str(tmp_path / "gone" / ".venv")
    return edited(tmp_path, "h200.json", lambda d: d["pythons"][0].update(requested=gone))


def test_verifying_the_h200_manifest_without_a_gpu_reports_gpu_drift(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu, "PyNvml", NoDriver)
    manifest = gone_venv(tmp_path)
    result = cli("verify", manifest, "--quick")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert "driver, CUDA and GPUs:" in lines
    assert "  NVML: available → not available (NVML: NVML Shared Library Not Found)" in lines
    assert any(line.startswith("  gpu0: NVIDIA H200, cc 9.0, 140.4 GiB, GPU-") and
               line.endswith("→ ∅") for line in lines)  # fmt: skip
    # the venv is not here: one line, not one per package
    assert any(line.startswith(f"  {tmp_path}/gone/.venv: cpython 3.12") for line in lines), lines
    assert not any(line.startswith("  torch:") for line in lines)
    # only drift is printed: nothing volatile
    assert "state" not in result.stdout
    data = cli("verify", manifest, "--quick", "--json").json()
    assert data["drift"] is True
    assert all(g["counts"] for g in data["groups"])


def test_verifying_the_h200_manifest_on_another_h200_names_the_other_card(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another H200 of the device tool (its NVML answers replayed): same model, other UUID."""
    monkeypatch.setattr(gpu, "PyNvml", lambda: h200("idle"))
    result = cli("verify", gone_venv(tmp_path), "--quick")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    old = json.loads(FIXTURE.read_text())["gpu"]["gpus"][0]["uuid"]
    assert f"  gpu0: NVIDIA H200, cc 9.0, 140.4 GiB, {old} → NVIDIA H200, cc 9.0, 140.4 GiB, " \
        f"{h200('idle').uuid(0)}" in lines  # fmt: skip
    assert not any(line.startswith("  NVML:") for line in lines)
