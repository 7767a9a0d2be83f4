"""What every kind of base produces: :class:`BaseImage`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from envbuild.build.image import History, OciImageConfig
from envbuild.build.layers import Layer
from envbuild.lock.model import BaseLock

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class BaseImage(BaseModel):
    """A base ready to be built on: its layers in the store, its config and history, its lock."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    key: str  # the derivation key of the base
    layers: list[Layer]
    config: OciImageConfig
    history: list[History]
    lock: BaseLock
    #: the setuid and setgid files it holds (path -> octal mode), kept (a base needs ``su``,
    #: ``passwd``, ``mount``) and shown: None where the kind of base does not record them
    setid: dict[str, str] | None = None

    def summary(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "key": self.key,
            "layers": [x.digest for x in self.layers],
        }
