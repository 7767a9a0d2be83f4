"""The host: OS, kernel, CPU, memory, and free disk on the paths that matter. Reads only what
any user can read (/etc/os-release, /proc/cpuinfo, /proc/meminfo, statvfs)."""

from __future__ import annotations

import logging
import os
import platform
import socket
from collections.abc import Iterable
from pathlib import Path

from envbuild.snapshot.model.host import Disk, HostSection, OsInfo

log = logging.getLogger(__name__)


def _os_release(path: Path = Path("/etc/os-release")) -> OsInfo:
    values: dict[str, str] = {}
    for candidate in (path, Path("/usr/lib/os-release")):
        try:
            text = candidate.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                values[key.strip()] = value.strip().strip('"').strip("'")
        break
    return OsInfo(
        id=values.get("ID"),
        version_id=values.get("VERSION_ID"),
        pretty_name=values.get("PRETTY_NAME"),
    )


def _cpu_model(path: Path = Path("/proc/cpuinfo")) -> str | None:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return platform.processor() or None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("model name", "Model", "cpu model"):
            return value.strip()
    return None


def _meminfo(path: Path = Path("/proc/meminfo")) -> tuple[int, int | None]:
    fields: dict[str, int] = {}
    try:
        for line in path.read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                fields[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    except OSError:
        pass
    total = fields.get("MemTotal")
    if total is None:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total, fields.get("MemAvailable")


def disk(role: str, path: str) -> Disk | None:
    """Space on the file system holding ``path`` (or its nearest existing parent)."""
    probe = Path(path).expanduser()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        st = os.statvfs(probe)
    except OSError:
        return None
    return Disk(
        role=role,
        path=path,
        mount_path=str(probe),
        total_bytes=st.f_blocks * st.f_frsize,
        free_bytes=st.f_bavail * st.f_frsize,
    )


def read_host(paths: Iterable[tuple[str, str]]) -> HostSection:
    """``paths``: (role, path) pairs whose free space matters."""
    total, available = _meminfo()
    disks = []
    for role, path in sorted(set(paths)):
        found = disk(role, path)
        if found is not None:
            disks.append(found)
    return HostSection(
        hostname=socket.gethostname(),
        os=_os_release(),
        kernel=platform.release(),
        arch=platform.machine(),
        cpu_model=_cpu_model(),
        logical_cpus=os.cpu_count() or 1,
        memory_total_bytes=total,
        memory_available_bytes=available,
        disks=disks,
    )
