"""Where a venv lives in an image (:class:`VenvTarget`): its prefix, interpreter, Python version
and wheel platform, the facts every stage that writes or reads an installed venv shares."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath


@dataclass(frozen=True)
class VenvTarget:
    """Where the venv lives in the image and which interpreter runs it."""

    venv: str = "/opt/venv"
    interpreter: str = "/usr/bin/python3"
    python_version: str = "3.11"
    platform: str | None = None  # a wheel platform tag: manylinux_2_36_x86_64

    @property
    def rel(self) -> PurePosixPath:
        return PurePosixPath(self.venv.lstrip("/"))

    @property
    def site_packages(self) -> str:
        return f"lib/python{self.python_version}/site-packages"

    @property
    def python(self) -> str:
        """The venv's own interpreter, as shebangs name it."""
        return f"{self.venv.rstrip('/')}/bin/python"

    def uv_platform(self) -> str | None:
        if not self.platform:
            return None
        tag = self.platform
        for arch in ("x86_64", "aarch64"):
            if tag.endswith("_" + arch):
                return f"{arch}-{tag.removesuffix('_' + arch)}"
        return tag

    def key(self) -> dict[str, object]:
        return {
            "venv": self.venv,
            "interpreter": self.interpreter,
            "python_version": self.python_version,
            "platform": self.platform,
        }
