"""The machine apply works on: its paths, how to probe it, how to drive its services, and where
store wheels come from. The CLI builds the real one; tests pass their own. (What a spec asks
of the machine, its ``[host]`` table, is :class:`envbuild.spec.model.Host`.)"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from envbuild.apply.paths import HF_HOME, Paths
from envbuild.apply.probe import HostProbe, SystemProbe
from envbuild.apply.services import ServiceManager, default_services
from envbuild.apply.wheels import IndexOnly, StoreWheels, WheelProvider
from envbuild.store.core import Store, default_store

log = logging.getLogger(__name__)


@dataclass
class HostAccess:
    """The interfaces apply reaches one machine through: its paths, a probe, its service
    manager and the source of store wheels."""

    paths: Paths
    probe: HostProbe
    services: ServiceManager
    wheels: WheelProvider = field(default_factory=IndexOnly)

    @property
    def store(self) -> Store:
        """The store whose install trees generations link: the store wheels' own, else the
        default store (:func:`~envbuild.store.core.default_store`). Never a remote cache."""
        store = self.wheels.store if isinstance(self.wheels, StoreWheels) else default_store()
        return Store(store.root)


def real_host(root: Path | str = "/", hf_home: str = HF_HOME) -> HostAccess:
    """The machine at ``root`` reached for real: its system probe, systemd, the store's wheels."""
    paths = Paths(Path(root), hf_home)
    return HostAccess(paths, SystemProbe(), default_services(paths.root), StoreWheels())
