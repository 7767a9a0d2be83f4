"""Where apply reads and writes: every path is under one root (``/`` on a real machine).

``--root DIR`` makes apply touch only ``DIR/...``, so it can be tried and tested without changing
the real system. The root is a prefix, not a chroot: paths written into units and scripts are the
real paths under the root, so a venv built under ``DIR`` runs from there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

STATE_DIR = "/var/lib/envbuild"
UNIT_DIR = "/etc/systemd/system"
SECRETS_DIR = "/etc/envbuild"
HF_HOME = "/var/lib/envbuild/huggingface"


@dataclass(frozen=True)
class Paths:
    """The locations apply uses, all under :attr:`root`."""

    root: Path = Path("/")
    hf_home_path: str = field(default=HF_HOME)

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root).absolute())

    def under(self, absolute: str) -> Path:
        """``absolute`` (a path as on the target system) placed under the root."""
        return self.root / absolute.lstrip("/")

    @property
    def is_real_root(self) -> bool:
        return self.root == Path("/")

    @property
    def state(self) -> Path:
        return self.under(STATE_DIR)

    @property
    def generations(self) -> Path:
        return self.state / "generations"

    @property
    def current(self) -> Path:
        """The symlink to the active generation, switched atomically."""
        return self.state / "current"

    @property
    def guard_file(self) -> Path:
        return self.state / "lock"

    @property
    def journal(self) -> Path:
        """The switch in progress (see :mod:`envbuild.apply.journal`); absent between switches."""
        return self.state / "switch.json"

    @property
    def last_switch(self) -> Path:
        """What the last finished switch did (the units it left stopped)."""
        return self.state / "last-switch.json"

    @property
    def units(self) -> Path:
        return self.under(UNIT_DIR)

    @property
    def secrets(self) -> Path:
        return self.under(SECRETS_DIR)

    @property
    def hf_home(self) -> Path:
        return self.under(self.hf_home_path)

    @property
    def hf_hub_cache(self) -> Path:
        return self.hf_home / "hub"

    def unit_file(self, unit: str) -> Path:
        return self.units / unit

    def env_file(self, name: str) -> Path:
        return self.secrets / f"{name}.env"
