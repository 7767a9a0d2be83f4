"""Small fakes for what cannot run in a container: systemd as PID 1, and GPUs.

:class:`FakeSystemd` is a :class:`~envbuild.apply.services.ServiceManager` that really runs a
unit: it reads the unit file apply installed, parses ``ExecStart``/``Environment``/
``EnvironmentFile``/``WorkingDirectory`` the way systemd does, starts the process (its own
session, output to a log file), and stops it with SIGTERM. Its state lives under the root
(``run/fake-systemd``), so another process (a CLI subprocess) sees the same units; it also keeps
``run/fake-proc/<pid>/cgroup`` so a unit's processes are found in their unit, as the kernel would
show them.

:class:`FakeNvml` is a :class:`~envbuild.snapshot.nvml.Nvml` with some H200s whose memory is held
by whatever units run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from envbuild.apply.host import HostAccess
from envbuild.apply.paths import HF_HOME, Paths
from envbuild.apply.probe import SystemProbe
from envbuild.apply.services import ServiceManager, UnitState
from envbuild.apply.wheels import StoreWheels
from envbuild.snapshot.nvml import Nvml

_C_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'", "s": " "}


def split_command(line: str) -> list[str]:
    """An ExecStart= value as systemd splits it: whitespace separates words, double quotes group
    with C escapes; then ``%%`` -> ``%`` and ``$$`` -> ``$``."""
    words: list[str] = []
    i, n = 0, len(line)
    while i < n:
        while i < n and line[i].isspace():
            i += 1
        if i >= n:
            break
        word = []
        quoted = line[i] == '"'
        if quoted:
            i += 1
        while i < n:
            c = line[i]
            if quoted and c == '"':
                i += 1
                break
            if not quoted and c.isspace():
                break
            if c == "\\" and i + 1 < n:
                word.append(_C_ESCAPES.get(line[i + 1], line[i + 1]))
                i += 2
                continue
            word.append(c)
            i += 1
        words.append("".join(word).replace("%%", "%").replace("$$", "$"))
    return words


def _unquote(value: str) -> str:
    return split_command(value)[0] if value.strip() else ""


def read_env_file(path: Path) -> dict[str, str]:
    """EnvironmentFile= as systemd reads our files: KEY="value" with backslash escapes."""
    out = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, _, raw = line.partition("=")
        value = raw
        if raw.startswith('"') and raw.endswith('"'):
            value, body, i = "", raw[1:-1], 0
            while i < len(body):
                if body[i] == "\\" and i + 1 < len(body):
                    value += body[i + 1]
                    i += 2
                else:
                    value += body[i]
                    i += 1
        out[key.strip()] = value
    return out


@dataclass
class UnitFile:
    exec_start: list[str]
    environment: dict[str, str]
    env_files: list[Path]
    working_directory: str | None

    @classmethod
    def parse(cls, path: Path) -> UnitFile:
        exec_start: list[str] = []
        env: dict[str, str] = {}
        files: list[Path] = []
        workdir = None
        for line in path.read_text().splitlines():
            if "=" not in line or line.startswith(("#", "[")):
                continue
            key, _, value = line.partition("=")
            if key == "ExecStart":
                exec_start = split_command(value)
            elif key == "Environment":
                k, _, v = _unquote(value).partition("=")
                env[k] = v
            elif key == "EnvironmentFile":
                files.append(Path(value.lstrip("-").replace("%%", "%")))
            elif key == "WorkingDirectory":
                workdir = value
        return cls(exec_start, env, files, workdir)


#: Every process a FakeSystemd in this interpreter started, by pid: kept so it can be reaped
#: (a unit outlives the FakeSystemd object that started it, as it outlives systemctl).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def _alive(pid: int) -> bool:
    if pid in _CHILDREN:
        return _CHILDREN[pid].poll() is None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@dataclass
class FakeSystemd(ServiceManager):
    paths: Paths
    reloads: int = 0

    @property
    def run_dir(self) -> Path:
        return self.paths.under("/run/fake-systemd")

    @property
    def proc_root(self) -> Path:
        return self.paths.under("/run/fake-proc")

    def _pid(self, unit: str) -> int | None:
        try:
            return int((self.run_dir / f"{unit}.pid").read_text())
        except (OSError, ValueError):
            return None

    def _running(self, unit: str) -> bool:
        pid = self._pid(unit)
        return pid is not None and _alive(pid)

    def reload(self) -> None:
        self.reloads += 1

    def start(self, unit: str) -> None:
        if self._running(unit):
            return
        spec = UnitFile.parse(self.paths.unit_file(unit))
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"}
        for f in spec.env_files:
            env.update(read_env_file(f))
        env.update(spec.environment)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with (self.run_dir / f"{unit}.log").open("ab") as log:
            proc = subprocess.Popen(
                spec.exec_start,
                cwd=spec.working_directory,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _CHILDREN[proc.pid] = proc
        (self.run_dir / f"{unit}.pid").write_text(str(proc.pid))
        fake = self.proc_root / str(proc.pid)
        fake.mkdir(parents=True, exist_ok=True)
        (fake / "cgroup").write_text(f"0::/system.slice/{unit}\n")
        (fake / "comm").write_text("vllm\n")

    def stop(self, unit: str) -> None:
        pid = self._pid(unit)
        if pid is not None and self._running(unit):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while self._running(unit) and time.monotonic() < deadline:
                time.sleep(0.05)
            if self._running(unit):
                os.killpg(pid, signal.SIGKILL)
        if pid is not None and pid in _CHILDREN:
            _CHILDREN.pop(pid).wait()
        (self.run_dir / f"{unit}.pid").unlink(missing_ok=True)
        (self.run_dir / f"{unit}.stopped").write_text("")

    def enable(self, unit: str) -> None:
        self._set("enabled", unit, True)

    def disable(self, unit: str) -> None:
        self._set("enabled", unit, False)

    def _set(self, name: str, unit: str, on: bool) -> None:
        path = self.run_dir / f"{name}.json"
        units = set(json.loads(path.read_text())) if path.exists() else set()
        units = units | {unit} if on else units - {unit}
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(sorted(units)))

    def enabled(self) -> set[str]:
        path = self.run_dir / "enabled.json"
        return set(json.loads(path.read_text())) if path.exists() else set()

    def state(self, unit: str) -> UnitState:
        if self._running(unit):
            return UnitState("active", "running")
        if (self.run_dir / f"{unit}.pid").exists():
            return UnitState("failed", "failed")
        return UnitState("inactive", "dead")

    def logs(self, unit: str, lines: int = 30) -> str:
        try:
            text = (self.run_dir / f"{unit}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def running_pids(self) -> list[int]:
        if not self.run_dir.is_dir():
            return []
        out = []
        for pidfile in sorted(self.run_dir.glob("*.pid")):
            unit = pidfile.name.removesuffix(".pid")
            pid = self._pid(unit)
            if pid is not None and self._running(unit):
                out.append(pid)
        return out

    def stop_all(self) -> None:
        for pidfile in sorted(self.run_dir.glob("*.pid")) if self.run_dir.is_dir() else []:
            self.stop(pidfile.name.removesuffix(".pid"))


GIB = 1 << 30


@dataclass
class FakeNvml(Nvml):
    """``count`` H200s on driver ``driver``; each pid ``holders()`` gives holds 100 GiB of GPU 0."""

    driver: str = "590.48.01"
    gpu_count: int = 2
    gpu_name: str = "NVIDIA H200"
    holders: Callable[[], list[int]] = list

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def driver_version(self) -> str:
        return self.driver

    def cuda_driver_version(self) -> int:
        return 13010

    def nvml_version(self) -> str | None:
        return "13.590.48"

    def count(self) -> int:
        return self.gpu_count

    def name(self, i: int) -> str:
        return self.gpu_name

    def uuid(self, i: int) -> str:
        return f"GPU-00000000-0000-0000-0000-00000000000{i}"

    def pci_bus_id(self, i: int) -> str | None:
        return None

    def compute_capability(self, i: int) -> tuple[int, int]:
        return (9, 0)

    def memory(self, i: int) -> tuple[int, int, int | None]:
        held = 100 * GIB * len(self.holders()) if i == 0 else 0
        return (141 * GIB, held, 616 << 20)

    def processes(self, i: int) -> list[tuple[int, int | None]]:
        return [(pid, 100 * GIB) for pid in self.holders()] if i == 0 else []

    def persistence(self, i: int) -> bool | None:
        return None

    def ecc(self, i: int) -> bool | None:
        return None

    def mig(self, i: int) -> bool | None:
        return None

    def nvlinks_active(self, i: int) -> int | None:
        return None

    def link(self, i: int, j: int) -> str:
        return "nvlink"


def fake_host(
    root: Path | str,
    hf_home: str = HF_HOME,
    *,
    gpus: int = 2,
    driver: str = "590.48.01",
    gpu_name: str = "NVIDIA H200",
    other_holders: tuple[int, ...] = (),
) -> HostAccess:
    """A machine under ``root`` with fake GPUs and a fake systemd; everything else is real.
    ``other_holders``: pids outside any unit that hold GPU memory too."""
    paths = Paths(Path(root), hf_home)
    services = FakeSystemd(paths)
    nvml = FakeNvml(
        driver=driver,
        gpu_count=gpus,
        gpu_name=gpu_name,
        holders=lambda: [*services.running_pids(), *other_holders],
    )
    probe = SystemProbe(nvml, proc_root=services.proc_root)
    return HostAccess(paths, probe, services, StoreWheels())
