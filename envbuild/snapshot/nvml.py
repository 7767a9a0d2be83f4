"""NVML (``nvidia-ml-py``'s ``pynvml`` module) behind a narrow interface.

:class:`Nvml` is the few questions envbuild asks of a GPU's driver; :class:`PyNvml` answers them
with the real library and turns NVML's enumerations and units into the words and numbers the
snapshot records. Tests without a GPU answer them with a small subclass of :class:`Nvml`.
"""

from __future__ import annotations

import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from envbuild.snapshot.model.gpu import GpuConfig, GpuState

log = logging.getLogger(__name__)

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
    def memory(self, i: int) -> tuple[int, int, int | None]:
        """(total, used, reserved) bytes, as NVML v2 gives them: used without the driver's
        reservation, as nvidia-smi shows it. Reserved is None where only NVML v1 answers (its used
        memory then includes the reservation)."""

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

    def config(self, i: int) -> GpuConfig:
        """How the GPU is set up (drift when it changes); nothing known by default."""
        return GpuConfig()

    def state(self, i: int) -> GpuState:
        """What changes on its own (never drift); nothing known by default."""
        return GpuState()


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

    def memory(self, i: int) -> tuple[int, int, int | None]:
        nv = self._nv
        version = getattr(nv, "nvmlMemory_v2", None)
        if version is not None:
            try:
                info = nv.nvmlDeviceGetMemoryInfo(self._h(i), version=version)
                return int(info.total), int(info.used), int(info.reserved)
            except nv.NVMLError as exc:  # an older driver: v1, used includes the reservation
                log.debug("NVML: nvmlDeviceGetMemoryInfo_v2: %s; using v1", exc)
        info = nv.nvmlDeviceGetMemoryInfo(self._h(i))
        return int(info.total), int(info.used), None

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

    def config(self, i: int) -> GpuConfig:
        nv, h, opt = self._nv, self._h(i), self._ask
        ecc = opt("nvmlDeviceGetEccMode", h)
        mig = opt("nvmlDeviceGetMigMode", h)
        limits = opt("nvmlDeviceGetPowerManagementLimitConstraints", h)
        remap = opt("nvmlDeviceGetRemappedRows", h)
        bar1 = opt("nvmlDeviceGetBAR1MemoryInfo", h)
        retired = opt("nvmlDeviceGetRetiredPagesPendingStatus", h)
        return GpuConfig(
            serial=_opt_text(opt("nvmlDeviceGetSerial", h)),
            board_part_number=_opt_text(opt("nvmlDeviceGetBoardPartNumber", h)),
            vbios_version=_opt_text(opt("nvmlDeviceGetVbiosVersion", h)),
            inforom_version=_opt_text(opt("nvmlDeviceGetInforomImageVersion", h)),
            compute_mode=_named(opt("nvmlDeviceGetComputeMode", h), COMPUTE_MODES),
            ecc_pending=None if ecc is None else ecc[1] == nv.NVML_FEATURE_ENABLED,
            mig_pending=None if mig is None else mig[1] == nv.NVML_FEATURE_ENABLED,
            virtualization_mode=_named(
                opt("nvmlDeviceGetVirtualizationMode", h), VIRTUALIZATION_MODES
            ),
            power_limit_w=_watts(opt("nvmlDeviceGetEnforcedPowerLimit", h)),
            power_limit_default_w=_watts(opt("nvmlDeviceGetPowerManagementDefaultLimit", h)),
            power_limit_max_w=None if limits is None else _watts(limits[1]),
            max_clocks_mhz=self._clocks("nvmlDeviceGetMaxClockInfo", h, ("graphics", "sm", "mem")),
            application_clocks_mhz=self._clocks(
                "nvmlDeviceGetApplicationsClock", h, ("graphics", "mem")
            ),
            pcie_max_generation=opt("nvmlDeviceGetMaxPcieLinkGeneration", h),
            pcie_max_width=opt("nvmlDeviceGetMaxPcieLinkWidth", h),
            pcie_width=opt("nvmlDeviceGetCurrPcieLinkWidth", h),
            bar1_total_bytes=None if bar1 is None else int(bar1.bar1Total),
            numa_node=_numa(opt("nvmlDeviceGetNumaNodeId", h)),
            cpu_affinity=_cpu_list(opt("nvmlDeviceGetCpuAffinity", h, _AFFINITY_WORDS)),
            remapped_rows_pending=None if remap is None else bool(remap[2]),
            remapped_rows_failure=None if remap is None else bool(remap[3]),
            retired_pages_pending=None if retired is None else bool(retired),
        )

    def state(self, i: int) -> GpuState:
        nv, h, opt = self._nv, self._h(i), self._ask
        pstate = opt("nvmlDeviceGetPerformanceState", h)
        util = opt("nvmlDeviceGetUtilizationRates", h)
        remap = opt("nvmlDeviceGetRemappedRows", h)
        bar1 = opt("nvmlDeviceGetBAR1MemoryInfo", h)
        reasons = opt("nvmlDeviceGetCurrentClocksEventReasons", h)
        errors = {}
        counters = {"volatile": nv.NVML_VOLATILE_ECC, "aggregate": nv.NVML_AGGREGATE_ECC}
        kinds = {
            "corrected": nv.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            "uncorrected": nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        }
        for counter_name, counter in counters.items():
            for kind_name, kind in kinds.items():
                count = opt("nvmlDeviceGetTotalEccErrors", h, kind, counter)
                if count is not None:
                    errors[f"{counter_name}_{kind_name}"] = int(count)
        return GpuState(
            performance_state=None if pstate is None or pstate > 15 else f"P{pstate}",
            temperature_c=opt("nvmlDeviceGetTemperature", h, nv.NVML_TEMPERATURE_GPU),
            power_draw_w=_watts(opt("nvmlDeviceGetPowerUsage", h)),
            utilization_gpu_percent=None if util is None else int(util.gpu),
            utilization_memory_percent=None if util is None else int(util.memory),
            clocks_mhz=self._clocks("nvmlDeviceGetClockInfo", h, ("graphics", "sm", "mem")),
            clocks_event_reasons=_reasons(reasons),
            pcie_generation=opt("nvmlDeviceGetCurrPcieLinkGeneration", h),
            ecc_errors=errors,
            remapped_rows_correctable=None if remap is None else int(remap[0]),
            remapped_rows_uncorrectable=None if remap is None else int(remap[1]),
            bar1_used_bytes=None if bar1 is None else int(bar1.bar1Used),
        )

    def _ask(self, function: str, *args: Any) -> Any:
        """NVML's ``function`` of ``args``, or None where the GPU does not support it or the
        installed nvidia-ml-py does not have it (an older one)."""
        fn = getattr(self._nv, function, None)
        if fn is None:
            log.debug("NVML: nvidia-ml-py has no %s", function)
            return None
        return self._optional(fn, *args)

    def _clocks(self, getter: str, h: Any, names: tuple[str, ...]) -> dict[str, int]:
        ids = {"graphics": self._nv.NVML_CLOCK_GRAPHICS, "sm": self._nv.NVML_CLOCK_SM,
               "mem": self._nv.NVML_CLOCK_MEM}  # fmt: skip
        out = {}
        for name in names:
            value = self._ask(getter, h, ids[name])
            if value is not None:
                out[name] = int(value)
        return out


#: NVML's enumerations as the words the snapshot records (nvml.h: nvmlComputeMode_t,
#: nvmlGpuVirtualizationMode_t, nvmlClocksEventReasons).
COMPUTE_MODES = {0: "default", 1: "exclusive-thread", 2: "prohibited", 3: "exclusive-process"}
VIRTUALIZATION_MODES = {0: "none", 1: "pass-through", 2: "vgpu", 3: "host-vgpu", 4: "host-vsga"}
CLOCKS_EVENT_REASONS = {
    0x1: "gpu-idle",
    0x2: "applications-clocks-setting",
    0x4: "sw-power-cap",
    0x8: "hw-slowdown",
    0x10: "sync-boost",
    0x20: "sw-thermal-slowdown",
    0x40: "hw-thermal-slowdown",
    0x80: "hw-power-brake-slowdown",
    0x100: "display-clocks-setting",
}
_AFFINITY_WORDS = 16  # 64-bit words: CPUs 0-1023


def _named(value: int | None, names: dict[int, str]) -> str | None:
    return None if value is None else names.get(int(value), f"unknown ({value})")


def _watts(milliwatts: int | None) -> float | None:
    return None if milliwatts is None else round(int(milliwatts) / 1000, 3)


def _numa(node: int | None) -> int | None:
    return None if node is None or int(node) < 0 else int(node)


def _reasons(mask: int | None) -> list[str]:
    if mask is None:
        return []
    names = [name for bit, name in CLOCKS_EVENT_REASONS.items() if int(mask) & bit]
    rest = int(mask) & ~sum(CLOCKS_EVENT_REASONS)
    return names + ([f"other (0x{rest:x})"] if rest else [])


def cpu_list(cpus: list[int]) -> str:
    """0,1,2,3,8 -> 0-3,8 (the kernel's cpulist format)."""
    runs: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if runs and runs[-1][1] == cpu - 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _cpu_list(words: Any) -> str | None:
    if words is None:
        return None
    cpus = [w * 64 + b for w, word in enumerate(words) for b in range(64) if int(word) >> b & 1]
    return cpu_list(cpus) or None


def _opt_text(value: Any) -> str | None:
    return None if value is None else _text(value)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
