"""Starting and stopping units, behind a narrow interface.

:class:`Systemctl` is the real one (``systemctl`` and ``journalctl`` through :func:`proc.run`).
:class:`NoServices` stands in where no service manager can be driven, e.g. ``--root DIR`` on a
machine whose systemd manages ``/``: units are installed, nothing is started or stopped. Tests
subclass :class:`ServiceManager` with one that really runs a unit's ``ExecStart``.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from envbuild.errors import EnvironmentFailure, ToolFailed
from envbuild.proc import core as proc

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UnitState:
    active: str  # systemd's ActiveState: active, activating, deactivating, inactive, failed
    sub: str = ""  # SubState: running, auto-restart, dead, …

    @property
    def running(self) -> bool:
        return self.active in ("active", "activating", "reloading", "deactivating")

    @property
    def crashed(self) -> bool:
        """Failed, or waiting to be restarted after a crash."""
        return self.active == "failed" or self.sub == "auto-restart"


class ServiceManager(ABC):
    """What apply asks of the service manager. Unit names are like ``envbuild-x.service``; the
    unit files themselves are written by apply into :attr:`Paths.units` before ``reload``."""

    #: False when units can be installed but not started here (see :class:`NoServices`).
    available: bool = True

    @abstractmethod
    def reload(self) -> None:
        """Make the manager re-read unit files."""

    @abstractmethod
    def start(self, unit: str) -> None: ...

    @abstractmethod
    def stop(self, unit: str) -> None: ...

    @abstractmethod
    def enable(self, unit: str) -> None: ...

    @abstractmethod
    def disable(self, unit: str) -> None: ...

    @abstractmethod
    def state(self, unit: str) -> UnitState: ...

    @abstractmethod
    def logs(self, unit: str, lines: int = 30) -> str:
        """The unit's last log lines, for an error message."""

    def is_running(self, unit: str) -> bool:
        return self.state(unit).running


class Systemctl(ServiceManager):
    """The machine's systemd."""

    def __init__(self) -> None:
        self._systemctl: str | None = None

    def _run(self, *args: str) -> proc.Completed:
        if self._systemctl is None:
            self._systemctl = proc.which("systemctl", hint="apply drives systemd; is this systemd?")
        return proc.run([self._systemctl, *args], tool="systemctl", env=proc.child_env())

    def reload(self) -> None:
        self._run("daemon-reload")

    def start(self, unit: str) -> None:
        log.info("starting %s", unit)
        self._run("start", unit)

    def stop(self, unit: str) -> None:
        log.info("stopping %s", unit)
        self._run("stop", unit)

    def enable(self, unit: str) -> None:
        self._run("enable", unit)

    def disable(self, unit: str) -> None:
        self._run("disable", unit)

    def state(self, unit: str) -> UnitState:
        out = self._run("show", "--property=ActiveState,SubState", unit).stdout
        props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        return UnitState(props.get("ActiveState", "inactive"), props.get("SubState", ""))

    def logs(self, unit: str, lines: int = 30) -> str:
        try:
            journalctl = proc.which("journalctl")
            done = proc.run(
                [journalctl, "--unit", unit, "--lines", str(lines), "--no-pager", "--output=cat"],
                tool="journalctl",
                env=proc.child_env(),
            )
        except (ToolFailed, EnvironmentFailure) as exc:
            return f"(journalctl failed: {exc.message})"
        return done.stdout


class NoServices(ServiceManager):
    """No service manager to drive: units are written, never started or stopped."""

    available = False

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def _refuse(self, what: str, unit: str) -> None:
        raise EnvironmentFailure(f"cannot {what} {unit}: {self.reason}")

    def reload(self) -> None:
        pass

    def start(self, unit: str) -> None:
        self._refuse("start", unit)

    def stop(self, unit: str) -> None:
        self._refuse("stop", unit)

    def enable(self, unit: str) -> None:
        pass

    def disable(self, unit: str) -> None:
        pass

    def state(self, unit: str) -> UnitState:
        return UnitState("inactive", "unknown")

    def logs(self, unit: str, lines: int = 30) -> str:
        return ""


def default_services(root: Path) -> ServiceManager:
    """systemd for the real root when it is running; otherwise :class:`NoServices`."""
    if root != Path("/"):
        return NoServices(f"--root {root} is not / (units are installed, not started)")
    if not Path("/run/systemd/system").is_dir():
        return NoServices("systemd is not running on this machine")
    return Systemctl()
