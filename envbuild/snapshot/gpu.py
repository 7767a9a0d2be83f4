"""The GPU section of a snapshot, read through :class:`~envbuild.snapshot.nvml.Nvml`.

On a machine without a driver, :func:`read_gpus` returns ``available: false`` and the library's
own reason. Each GPU process is tied to the systemd unit that owns it through
``/proc/<pid>/cgroup``. :func:`gpu_warnings` names what an operator must hear about even when
nothing drifted.
"""

from __future__ import annotations

import logging
from pathlib import Path

from envbuild.snapshot.model.gpu import Gpu, GpuLink, GpuProcess, GpuSection
from envbuild.snapshot.nvml import GpuUnavailable, Nvml, PyNvml

log = logging.getLogger(__name__)


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


def gpu_warnings(section: GpuSection) -> list[str]:
    """What a GPU operator must hear about even when nothing drifted: a PCIe link that trained
    narrower than it can (a reseat, a riser, a bad slot), rows waiting to be remapped (the GPU
    needs a reset), a failed remap or retired pages pending, and modes that change at reset."""
    out = []
    for g in section.gpus:
        c, name = g.config, f"gpu{g.index}"
        if c.pcie_width is not None and c.pcie_max_width and c.pcie_width < c.pcie_max_width:
            out.append(
                f"{name}: PCIe link trained at x{c.pcie_width}, below its maximum "
                f"x{c.pcie_max_width}"
            )
        if c.remapped_rows_pending:
            out.append(f"{name}: memory rows are waiting to be remapped: reset the GPU")
        if c.remapped_rows_failure:
            out.append(f"{name}: a memory row remapping failed: the GPU needs service")
        if c.retired_pages_pending:
            out.append(f"{name}: memory pages are waiting to be retired: reset the GPU")
        for mode, now, pending in (("ECC", g.ecc_enabled, c.ecc_pending),
                                   ("MIG", g.mig_enabled, c.mig_pending)):  # fmt: skip
            if None not in (now, pending) and now != pending:
                out.append(f"{name}: {mode} changes to {'on' if pending else 'off'} at reset")
    return out


def cuda_version_text(value: int) -> str:
    """NVML's CUDA version number (13000) as text (13.0)."""
    return f"{value // 1000}.{value % 1000 // 10}"


def read_gpus(lib: Nvml | None = None, *, proc_root: Path = Path("/proc")) -> GpuSection:
    """The driver, each GPU (its processes tied to their units) and the links between GPUs."""
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
            total, used, reserved = lib.memory(i)
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
                    memory_reserved_bytes=reserved,
                    config=lib.config(i),
                    state=lib.state(i),
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
