"""NVIDIA GPUs through NVML (``nvidia-ml-py``'s ``pynvml`` module), behind a narrow interface.

:class:`Nvml` is the few questions envbuild asks; :class:`PyNvml` answers them with the real
library. On a machine without a driver, :func:`read_gpus` returns ``available: false`` and the
library's own reason. Each GPU process is tied to the systemd unit that owns it through
``/proc/<pid>/cgroup``.
"""

from __future__ import annotations

import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from envbuild.snapshot.model import Gpu, GpuLink, GpuProcess, GpuSection

log = logging.getLogger("envbuild.snapshot.gpu")

T = TypeVar("T")


class GpuUnavailable(Exception):
    """NVML cannot be used here; the message says why."""


class Nvml(ABC):
    """What envbuild asks NVML. Optional facts return None where the GPU does not support them."""

    @abstractmethod
    def open(self) -> None:
        """Initialise; raise :class:`GpuUnavailable` with the reason when there is no driver."""

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def driver_version(self) -> str: ...

    @abstractmethod
    def cuda_driver_version(self) -> int:
        """As NVML gives it: 1000 * major + 10 * minor (13000 is 13.0)."""

    @abstractmethod
    def nvml_version(self) -> str | None: ...

    @abstractmethod
    def count(self) -> int: ...

    @abstractmethod
    def name(self, i: int) -> str: ...

    @abstractmethod
    def uuid(self, i: int) -> str: ...

    @abstractmethod
    def pci_bus_id(self, i: int) -> str | None: ...

    @abstractmethod
    def compute_capability(self, i: int) -> tuple[int, int]: ...

    @abstractmethod
    def memory(self, i: int) -> tuple[int, int]:
        """(total, used) bytes."""

    @abstractmethod
    def processes(self, i: int) -> list[tuple[int, int | None]]:
        """(pid, used bytes or None when NVML cannot tell) of compute and graphics processes."""

    @abstractmethod
    def persistence(self, i: int) -> bool | None: ...

    @abstractmethod
    def ecc(self, i: int) -> bool | None: ...

    @abstractmethod
    def mig(self, i: int) -> bool | None: ...

    @abstractmethod
    def nvlinks_active(self, i: int) -> int | None: ...

    @abstractmethod
    def link(self, i: int, j: int) -> str:
        """``nvlink`` when the two GPUs talk over NVLink, else their PCIe common ancestor."""


class PyNvml(Nvml):
    """The real NVML, through ``import pynvml`` from the ``nvidia-ml-py`` distribution."""

    _ANCESTORS: ClassVar[dict[str, str]] = {
        "NVML_TOPOLOGY_INTERNAL": "same-board",
        "NVML_TOPOLOGY_SINGLE": "pcie-switch",
        "NVML_TOPOLOGY_MULTIPLE": "pcie-switches",
        "NVML_TOPOLOGY_HOSTBRIDGE": "pcie-hostbridge",
        "NVML_TOPOLOGY_NODE": "numa-node",
        "NVML_TOPOLOGY_SYSTEM": "system",
    }

    def __init__(self) -> None:
        self._nv: Any = None
        self._handles: dict[int, Any] = {}

    def open(self) -> None:
        try:
            import pynvml  # type: ignore[import-untyped]
        except ImportError as exc:
            raise GpuUnavailable(f"nvidia-ml-py is not installed ({exc})") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise GpuUnavailable(f"NVML: {exc}") from exc
        self._nv = pynvml

    def close(self) -> None:
        if self._nv is not None:
            with contextlib.suppress(self._nv.NVMLError):
                self._nv.nvmlShutdown()
            self._nv = None
            self._handles.clear()

    def _h(self, i: int) -> Any:
        if i not in self._handles:
            self._handles[i] = self._nv.nvmlDeviceGetHandleByIndex(i)
        return self._handles[i]

    def _optional(self, fn: Callable[..., T], *args: Any) -> T | None:
        try:
            return fn(*args)
        except self._nv.NVMLError as exc:
            log.debug("NVML: optional fact not available: %s", exc)
            return None

    def driver_version(self) -> str:
        return str(_text(self._nv.nvmlSystemGetDriverVersion()))

    def cuda_driver_version(self) -> int:
        return int(self._nv.nvmlSystemGetCudaDriverVersion_v2())

    def nvml_version(self) -> str | None:
        return self._optional(lambda: _text(self._nv.nvmlSystemGetNVMLVersion()))

    def count(self) -> int:
        return int(self._nv.nvmlDeviceGetCount())

    def name(self, i: int) -> str:
        return _text(self._nv.nvmlDeviceGetName(self._h(i)))

    def uuid(self, i: int) -> str:
        return _text(self._nv.nvmlDeviceGetUUID(self._h(i)))

    def pci_bus_id(self, i: int) -> str | None:
        info = self._optional(lambda: self._nv.nvmlDeviceGetPciInfo_v3(self._h(i)))
        return None if info is None else _text(info.busId)

    def compute_capability(self, i: int) -> tuple[int, int]:
        major, minor = self._nv.nvmlDeviceGetCudaComputeCapability(self._h(i))
        return int(major), int(minor)

    def memory(self, i: int) -> tuple[int, int]:
        info = self._nv.nvmlDeviceGetMemoryInfo(self._h(i))
        return int(info.total), int(info.used)

    def processes(self, i: int) -> list[tuple[int, int | None]]:
        found: dict[int, int | None] = {}
        for getter in (
            self._nv.nvmlDeviceGetComputeRunningProcesses,
            self._nv.nvmlDeviceGetGraphicsRunningProcesses,
        ):
            for p in self._optional(getter, self._h(i)) or []:
                used = p.usedGpuMemory
                found[int(p.pid)] = int(used) if isinstance(used, int) and used >= 0 else None
        return sorted(found.items())

    def persistence(self, i: int) -> bool | None:
        mode = self._optional(lambda: self._nv.nvmlDeviceGetPersistenceMode(self._h(i)))
        return None if mode is None else mode == self._nv.NVML_FEATURE_ENABLED

    def ecc(self, i: int) -> bool | None:
        modes = self._optional(lambda: self._nv.nvmlDeviceGetEccMode(self._h(i)))
        return None if modes is None else modes[0] == self._nv.NVML_FEATURE_ENABLED

    def mig(self, i: int) -> bool | None:
        modes = self._optional(lambda: self._nv.nvmlDeviceGetMigMode(self._h(i)))
        return None if modes is None else modes[0] == self._nv.NVML_FEATURE_ENABLED

    def nvlinks_active(self, i: int) -> int | None:
        active, supported = 0, False
        for link in range(self._nv.NVML_NVLINK_MAX_LINKS):
            state = self._optional(self._nv.nvmlDeviceGetNvLinkState, self._h(i), link)
            if state is None:
                if not supported:
                    break  # no NVLink on this GPU (or none NVML can see)
                continue
            supported = True
            active += int(state == self._nv.NVML_FEATURE_ENABLED)
        return active if supported else None

    def link(self, i: int, j: int) -> str:
        nv = self._nv
        p2p = self._optional(
            lambda: nv.nvmlDeviceGetP2PStatus(self._h(i), self._h(j), nv.NVML_P2P_CAPS_INDEX_NVLINK)
        )
        if p2p == nv.NVML_P2P_STATUS_OK:
            return "nvlink"
        level = self._optional(
            lambda: nv.nvmlDeviceGetTopologyCommonAncestor(self._h(i), self._h(j))
        )
        for const, label in self._ANCESTORS.items():
            if level is not None and level == getattr(nv, const, object()):
                return label
        return "unknown"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def unit_of_pid(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """The systemd unit (service, else scope) whose cgroup holds ``pid``; None if none or
    unreadable (another user's process, another PID namespace)."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text(errors="replace")
    except OSError:
        return None
    for suffix in (".service", ".scope"):
        for line in text.splitlines():
            path = line.split(":", 2)[-1]
            found = [part for part in path.split("/") if part.endswith(suffix)]
            if found:
                return found[-1]
    return None


def _comm(pid: int, proc_root: Path) -> str | None:
    try:
        return (proc_root / str(pid) / "comm").read_text(errors="replace").strip() or None
    except OSError:
        return None


def cuda_version_text(value: int) -> str:
    return f"{value // 1000}.{value % 1000 // 10}"


def read_gpus(lib: Nvml | None = None, *, proc_root: Path = Path("/proc")) -> GpuSection:
    lib = lib if lib is not None else PyNvml()
    try:
        lib.open()
    except GpuUnavailable as exc:
        log.info("no GPU facts: %s", exc)
        return GpuSection(available=False, reason=str(exc))
    try:
        gpus = []
        n = lib.count()
        for i in range(n):
            total, used = lib.memory(i)
            major, minor = lib.compute_capability(i)
            gpus.append(
                Gpu(
                    index=i,
                    name=lib.name(i),
                    uuid=lib.uuid(i),
                    pci_bus_id=lib.pci_bus_id(i),
                    compute_capability=f"{major}.{minor}",
                    memory_total_bytes=total,
                    memory_used_bytes=used,
                    persistence_mode=lib.persistence(i),
                    ecc_enabled=lib.ecc(i),
                    mig_enabled=lib.mig(i),
                    nvlinks_active=lib.nvlinks_active(i),
                    processes=[
                        GpuProcess(
                            pid=pid,
                            name=_comm(pid, proc_root),
                            used_memory_bytes=mem,
                            unit=unit_of_pid(pid, proc_root),
                        )
                        for pid, mem in lib.processes(i)
                    ],
                )
            )
        links = [GpuLink(a=i, b=j, link=lib.link(i, j)) for i in range(n) for j in range(i + 1, n)]
        return GpuSection(
            available=True,
            driver_version=lib.driver_version(),
            cuda_driver_version=cuda_version_text(lib.cuda_driver_version()),
            nvml_version=lib.nvml_version(),
            gpus=gpus,
            topology=links,
        )
    finally:
        lib.close()
