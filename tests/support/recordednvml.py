"""An NVML that answers what a real GPU answered: it replays a recording made through envbuild's
own :class:`~envbuild.snapshot.nvml.PyNvml` on the machine (``tests/fixtures/h200-nvml-*.json``,
written by ``tests/fixtures/h200-nvml-record.py``). A question the recording does not hold is an
error of the test, not a None."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from envbuild.snapshot.model.gpu import GpuConfig, GpuState
from envbuild.snapshot.nvml import Nvml

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


class RecordedNvml(Nvml):
    def __init__(self, recording: Path, *, pids: dict[int, int] | None = None) -> None:
        """``pids``: recorded pid -> the pid to report (the recorded one is gone here)."""
        data = json.loads(Path(recording).read_text())
        self.raw: list[dict[str, Any]] = data["raw"]
        self.answers: dict[tuple[str, tuple[Any, ...]], Any] = {}
        for call in data["calls"]:
            assert "error" not in call, f"{recording}: {call}"
            self.answers[(call["method"], tuple(call["args"]))] = call["result"]
        self.pids = pids or {}
        self.opened = False

    def _get(self, method: str, *args: Any) -> Any:
        return self.answers[(method, args)]

    def open(self) -> None:
        self.opened = True

    def close(self) -> None:
        self.opened = False

    def driver_version(self) -> str:
        return str(self._get("driver_version"))

    def cuda_driver_version(self) -> int:
        return int(self._get("cuda_driver_version"))

    def nvml_version(self) -> str | None:
        value = self._get("nvml_version")
        return None if value is None else str(value)

    def count(self) -> int:
        return int(self._get("count"))

    def name(self, i: int) -> str:
        return str(self._get("name", i))

    def uuid(self, i: int) -> str:
        return str(self._get("uuid", i))

    def pci_bus_id(self, i: int) -> str | None:
        value = self._get("pci_bus_id", i)
        return None if value is None else str(value)

    def compute_capability(self, i: int) -> tuple[int, int]:
        major, minor = self._get("compute_capability", i)
        return int(major), int(minor)

    def memory(self, i: int) -> tuple[int, int, int | None]:
        total, used, reserved = self._get("memory", i)
        return int(total), int(used), reserved

    def processes(self, i: int) -> list[tuple[int, int | None]]:
        return [(self.pids.get(pid, pid), used) for pid, used in self._get("processes", i)]

    def persistence(self, i: int) -> bool | None:
        return self._get("persistence", i)  # type: ignore[no-any-return]

    def ecc(self, i: int) -> bool | None:
        return self._get("ecc", i)  # type: ignore[no-any-return]

    def mig(self, i: int) -> bool | None:
        return self._get("mig", i)  # type: ignore[no-any-return]

    def nvlinks_active(self, i: int) -> int | None:
        return self._get("nvlinks_active", i)  # type: ignore[no-any-return]

    def link(self, i: int, j: int) -> str:
        return str(self._get("link", i, j))

    def config(self, i: int) -> GpuConfig:
        return GpuConfig.model_validate(self._get("config", i))

    def state(self, i: int) -> GpuState:
        return GpuState.model_validate(self._get("state", i))


def h200(moment: str = "held", **kwargs: Any) -> RecordedNvml:
    """The real H200 of the device machine, idle or with a process holding 20 GiB."""
    return RecordedNvml(FIXTURES / f"h200-nvml-{moment}.json", **kwargs)
