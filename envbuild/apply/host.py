"""The machine apply works on: its paths, how to probe it, how to drive its services, and where
store wheels come from. The CLI builds the real one; tests pass their own."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from envbuild.apply.paths import HF_HOME, Paths
from envbuild.apply.probe import HostProbe, SystemProbe
from envbuild.apply.services import ServiceManager, default_services
from envbuild.apply.wheels import IndexOnly, StoreWheels, WheelProvider


@dataclass
class Host:
    paths: Paths
    probe: HostProbe
    services: ServiceManager
    wheels: WheelProvider = field(default_factory=IndexOnly)


def real_host(root: Path | str = "/", hf_home: str = HF_HOME) -> Host:
    paths = Paths(Path(root), hf_home)
    return Host(paths, SystemProbe(), default_services(paths.root), StoreWheels())
