"""The snapshot's models of NVIDIA GPUs as NVML reports them: each GPU's identity, configuration
(drift when it changes) and state (volatile: shown, never drift), its processes, and the links
between GPUs."""

from __future__ import annotations

import logging

from pydantic import Field

from envbuild.snapshot.model.base import Bytes, Strict

log = logging.getLogger(__name__)


class GpuProcess(Strict):
    pid: int
    name: str | None = Field(description="the process's comm name, when readable")
    used_memory_bytes: Bytes | None
    unit: str | None = Field(description="the systemd unit owning the process (from its cgroup)")


class GpuConfig(Strict):
    """What the GPU is and how it is set up: a change of any of these is drift. None: NVML
    cannot tell on this GPU (or the snapshot is older than the fact)."""

    serial: str | None = None
    board_part_number: str | None = None
    vbios_version: str | None = None
    inforom_version: str | None = Field(default=None, description="the InfoROM image version")
    compute_mode: str | None = Field(default=None, description="default, exclusive-process …")
    ecc_pending: bool | None = Field(default=None, description="ECC mode after the next reset")
    mig_pending: bool | None = Field(default=None, description="MIG mode after the next reset")
    virtualization_mode: str | None = Field(default=None, description="none, pass-through, vgpu …")
    power_limit_w: float | None = Field(default=None, description="the enforced power limit")
    power_limit_default_w: float | None = None
    power_limit_max_w: float | None = None
    max_clocks_mhz: dict[str, int] = Field(default_factory=dict, description="graphics, sm, mem")
    application_clocks_mhz: dict[str, int] = Field(
        default_factory=dict, description="graphics, mem (set with nvidia-smi -ac)"
    )
    pcie_max_generation: int | None = Field(default=None, description="what GPU and slot can do")
    pcie_max_width: int | None = None
    pcie_width: int | None = Field(default=None, description="lanes the link trained at")
    bar1_total_bytes: Bytes | None = None
    numa_node: int | None = None
    cpu_affinity: str | None = Field(default=None, description="the CPUs near the GPU, as 0-15,32")
    remapped_rows_pending: bool | None = Field(default=None, description="a reset is needed")
    remapped_rows_failure: bool | None = None
    retired_pages_pending: bool | None = None


class GpuState(Strict):
    """What changes on its own while the GPU runs: recorded, shown, never counted as drift."""

    performance_state: str | None = Field(default=None, description="P0 (fastest) … P15")
    temperature_c: int | None = None
    power_draw_w: float | None = None
    utilization_gpu_percent: int | None = None
    utilization_memory_percent: int | None = None
    clocks_mhz: dict[str, int] = Field(default_factory=dict, description="graphics, sm, mem now")
    clocks_event_reasons: list[str] = Field(
        default_factory=list, description="why the clocks are below their maximum now"
    )
    pcie_generation: int | None = Field(default=None, description="drops while the GPU idles")
    ecc_errors: dict[str, int] = Field(
        default_factory=dict,
        description="volatile_corrected, volatile_uncorrected, aggregate_corrected, "
        "aggregate_uncorrected",
    )
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    bar1_used_bytes: Bytes | None = None


class Gpu(Strict):
    index: int
    name: str
    uuid: str
    pci_bus_id: str | None = None
    compute_capability: str = Field(description="major.minor, e.g. 9.0")
    memory_total_bytes: Bytes
    memory_used_bytes: Bytes = Field(
        description="volatile; without the driver's reservation (NVML v2), as nvidia-smi shows"
    )
    memory_reserved_bytes: Bytes | None = Field(
        default=None,
        description="held by the driver and firmware (NVML v2); None: only NVML v1, whose used "
        "memory includes it",
    )
    config: GpuConfig = Field(default_factory=GpuConfig)
    state: GpuState = Field(default_factory=GpuState)
    persistence_mode: bool | None = None
    ecc_enabled: bool | None = None
    mig_enabled: bool | None = None
    nvlinks_active: int | None = None
    processes: list[GpuProcess] = Field(default_factory=list, description="volatile")


class GpuLink(Strict):
    a: int
    b: int
    link: str = Field(description="nvlink, or the PCIe common ancestor (pcie-switch, pcie-host …)")


class GpuSection(Strict):
    available: bool
    reason: str | None = Field(default=None, description="why NVML could not be used")
    driver_version: str | None = None
    cuda_driver_version: str | None = Field(default=None, description="CUDA driver API, e.g. 13.0")
    nvml_version: str | None = None
    gpus: list[Gpu] = Field(default_factory=list)
    topology: list[GpuLink] = Field(default_factory=list)
