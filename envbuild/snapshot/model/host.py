"""The snapshot's models of the machine itself: operating system, kernel, CPUs, memory, the disks
that matter, and the CUDA toolkits and system libraries installed on it."""

from __future__ import annotations

import logging

from pydantic import Field

from envbuild.snapshot.model.base import Bytes, Strict

log = logging.getLogger(__name__)


class OsInfo(Strict):
    id: str | None = None
    version_id: str | None = None
    pretty_name: str | None = None


class Disk(Strict):
    role: str = Field(description="why this path matters: root, tmp, store, hf-cache, venv …")
    path: str = Field(description="the path asked about")
    mount_path: str = Field(description="the existing directory measured (the path or a parent)")
    total_bytes: Bytes
    free_bytes: Bytes = Field(description="space an unprivileged user can still write (volatile)")


class HostSection(Strict):
    """The machine: its OS, kernel and hardware (memory available and free disk are volatile)."""

    hostname: str
    os: OsInfo
    kernel: str
    arch: str
    cpu_model: str | None
    logical_cpus: int
    memory_total_bytes: Bytes
    memory_available_bytes: Bytes | None = Field(default=None, description="volatile")
    disks: list[Disk] = Field(default_factory=list)


class CudaToolkit(Strict):
    path: str = Field(description="the nvcc binary (resolved)")
    version: str
    build: str | None = None


class CudaLibrary(Strict):
    name: str = Field(description="libcudnn, libcudnn_ops …")
    version: str = Field(description="from the file name: 9.14.0")
    path: str
