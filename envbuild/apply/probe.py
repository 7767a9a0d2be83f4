"""What apply needs to know about the machine, behind one narrow interface.

:class:`HostProbe` answers: the driver and GPUs, who holds GPU memory (and in which systemd
unit), the CUDA toolkit, free disk. :class:`SystemProbe` is the real one, built on the snapshot
stage's readers (NVML through :class:`envbuild.snapshot.nvml.Nvml`, nvcc, ``/proc``). Without a
GPU, tests give it a small :class:`~envbuild.snapshot.nvml.Nvml` subclass and a ``/proc`` folder.
"""

from __future__ import annotations

import shutil
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from envbuild.errors import EnvironmentFailure
from envbuild.snapshot import cuda
from envbuild.snapshot import gpu as snapshot_gpu
from envbuild.snapshot.model.gpu import GpuSection
from envbuild.snapshot.nvml import Nvml


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_bytes: int


@dataclass(frozen=True)
class GpuProcess:
    """A process holding GPU memory, with the systemd unit it runs in (when it runs in one)."""

    pid: int
    gpu: int
    used_bytes: int
    command: str
    unit: str | None


@dataclass(frozen=True)
class Toolkit:
    version: str  # as nvcc reports it: 13.0
    nvcc: str


class HostProbe(ABC):
    """Facts about the machine apply decides on."""

    @abstractmethod
    def driver_version(self) -> str:
        """The NVIDIA driver's version (590.48.01). Raises :class:`EnvironmentFailure`."""

    @abstractmethod
    def gpus(self) -> list[Gpu]:
        """The GPUs, by index. Raises :class:`EnvironmentFailure`."""

    @abstractmethod
    def gpu_processes(self) -> list[GpuProcess]:
        """Processes holding GPU memory. Raises :class:`EnvironmentFailure`."""

    @abstractmethod
    def cuda_toolkit(self) -> Toolkit | None:
        """The toolkit a source build would use, or None."""

    def cuda_driver_version(self) -> str | None:
        """The newest CUDA the driver runs (``13.1``), or None when this probe cannot tell."""
        return None

    def free_bytes(self, path: Path) -> int:
        """Free space on the file system that holds (or will hold) ``path``."""
        probe = Path(path)
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        return shutil.disk_usage(probe).free


class SystemProbe(HostProbe):
    """The real machine, read through the snapshot stage's readers."""

    def __init__(self, nvml: Nvml | None = None, *, proc_root: Path = Path("/proc")) -> None:
        self.nvml = nvml
        self.proc_root = proc_root
        self._section: GpuSection | None = None

    def section(self) -> GpuSection:
        """What NVML says, read once per probe."""
        if self._section is None:
            self._section = snapshot_gpu.read_gpus(self.nvml, proc_root=self.proc_root)
        if not self._section.available:
            raise EnvironmentFailure(
                f"no GPU facts: {self._section.reason}",
                hint="is the NVIDIA driver installed and loaded? (`nvidia-smi` should work)",
            )
        return self._section

    def driver_version(self) -> str:
        return self.section().driver_version or "unknown"

    def cuda_driver_version(self) -> str | None:
        return self.section().cuda_driver_version

    def gpus(self) -> list[Gpu]:
        return [Gpu(g.index, g.name, g.memory_total_bytes) for g in self.section().gpus]

    def gpu_processes(self) -> list[GpuProcess]:
        return [
            GpuProcess(p.pid, g.index, p.used_memory_bytes or 0, p.name or "?", p.unit)
            for g in self.section().gpus
            for p in g.processes
        ]

    def cuda_toolkit(self) -> Toolkit | None:
        found = cuda.read_toolkits()
        return Toolkit(found[0].version, found[0].path) if found else None
