"""CUDA arch lists as source builds write them, and whether they cover a GPU.

Two spellings exist: torch's ``TORCH_CUDA_ARCH_LIST`` (``"8.0;9.0;12.0+PTX"``, compute
capabilities with a dot, ``;`` or space separated, ``+PTX`` to add PTX, ``a``/``f`` suffixes for
arch-specific and family-specific code) and SM numbers without a dot as flash-attn's
``FLASH_ATTN_CUDA_ARCHS`` reads them (``"80;90;100;120"``).

Coverage follows CUDA's binary compatibility: code for ``sm_XY`` runs on ``X.Z`` for ``Z >= Y``
(same major); ``sm_XYa`` runs only on ``X.Y``; PTX for ``compute_XY`` is JIT-compiled on any
GPU of capability ``>= X.Y``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TORCH_TOKEN = re.compile(r"(\d{1,2})\.(\d)([af]?)(\+PTX)?", re.IGNORECASE)
_SM_TOKEN = re.compile(r"(\d{1,2})(\d)([af]?)")


@dataclass(frozen=True)
class Arch:
    major: int
    minor: int
    suffix: str = ""  # "", "a" (arch-specific) or "f" (family-specific)
    ptx: bool = False

    @property
    def capability(self) -> str:
        return f"{self.major}.{self.minor}"

    def __str__(self) -> str:
        return f"{self.capability}{self.suffix}" + ("+PTX" if self.ptx else "")

    def covers(self, capability: str) -> bool:
        major, minor = (int(p) for p in capability.split("."))
        if (self.major, self.minor) == (major, minor):
            return True
        if self.ptx and (self.major, self.minor) <= (major, minor):
            return True
        return self.suffix != "a" and self.major == major and self.minor <= minor


def split(value: str) -> list[str]:
    return [t for t in re.split(r"[;\s,]+", value.strip()) if t]


def parse_torch(value: str) -> tuple[list[Arch], list[str]]:
    """Parse a ``TORCH_CUDA_ARCH_LIST`` value: the archs, and the tokens that are not archs."""
    archs: list[Arch] = []
    bad: list[str] = []
    for token in split(value):
        m = _TORCH_TOKEN.fullmatch(token)
        if m:
            archs.append(Arch(int(m.group(1)), int(m.group(2)), m.group(3).lower(), bool(m[4])))
        else:
            bad.append(token)
    return archs, bad


def parse_sm(value: str) -> tuple[list[Arch], list[str]]:
    """Parse an SM-number list such as ``FLASH_ATTN_CUDA_ARCHS`` (``"80;90;120"``)."""
    archs: list[Arch] = []
    bad: list[str] = []
    for token in split(value):
        m = _SM_TOKEN.fullmatch(token)
        if m:
            archs.append(Arch(int(m.group(1)), int(m.group(2)), m.group(3).lower()))
        else:
            bad.append(token)
    return archs, bad


def uncovered(archs: list[Arch], capabilities: list[str]) -> list[str]:
    """The compute capabilities no arch in ``archs`` produces code for."""
    return [cc for cc in capabilities if not any(a.covers(cc) for a in archs)]


def sm(arch: Arch) -> str:
    """``Arch(12, 0)`` → ``"120"``, the SM-number spelling."""
    return f"{arch.major}{arch.minor}{arch.suffix}"
