"""GPU architectures: one :class:`Arch`, the arch lists build flags write, and what runs where.

One name, many spellings. :meth:`Arch.parse` reads a single architecture as nvcc, cuobjdump and
the knowledge base write it (``sm_90a``, ``compute_120f``, ``lto_90``, ``120``, ``12.0``,
``9.0a``). The lists in build flags are read the way the tool that consumes them reads them, so
that what validation accepts is what the build really gets:

* ``TORCH_CUDA_ARCH_LIST`` (torch's ``cpp_extension``): spaces become ``;``, the value is split on
  ``;``, and each item must be ``X.Y`` with an optional ``a``/``f`` suffix and ``+PTX`` (SASS for
  ``sm_XY``, plus PTX for ``compute_XY`` with ``+PTX``). Torch refuses anything else, a comma,
  ``sm_90``, ``+ptx`` or an empty item (``"8.0; 9.0"``) included, so those are refused here.
* SM-number lists such as flash-attn's ``FLASH_ATTN_CUDA_ARCHS`` (``"80;90;120"``): split on
  ``;`` only, each item compared as written, so ``"80,90"`` or ``"80; 90"`` would silently build
  nothing for those items; they are refused. Empty items are ignored, as the tool ignores them.

Which code runs on a GPU of compute capability ``D`` (:func:`runs_on`), after the CUDA C++
Programming Guide ("Binary Compatibility", "PTX Compatibility", "Feature Set Compiler Targets")
and NVIDIA's "NVIDIA Blackwell and NVIDIA CUDA 12.9 Introduce Family-Specific Architecture
Features":

* SASS for ``sm_XY`` runs on ``X.z`` with ``z >= Y`` (sm_120 on 12.1, sm_80 on 8.9; never
  across a major: sm_90 does not run on 10.0);
* PTX for ``compute_XY`` is JIT-compiled for any capability ``>= X.Y``, a newer major included;
* arch-specific ``a`` code (SASS or PTX, ``sm_90a``, ``compute_100a``) runs only on exactly
  ``X.Y``;
* family-specific ``f`` code (CUDA 12.9+, SASS or PTX, ``sm_100f``, ``compute_120f``) runs on
  the same major with an equal or higher minor (100f: 10.0 and 10.3; 120f: 12.0 and 12.1) and
  never on another major, its PTX included.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

log = logging.getLogger(__name__)

Suffix = Literal["", "a", "f"]
ListFormat = Literal["torch", "sm"]

_NAME = re.compile(r"(?:(?:sm|compute|lto)_)?(\d{2,3})([af]?)")
_CC = re.compile(r"(\d{1,2})\.(\d)([af]?)")
_TORCH_ITEM = re.compile(r"(\d{1,2}\.\d[af]?)(\+PTX)?")
_SM_ITEM = re.compile(r"\d{2,3}[af]?")

TORCH_HINT = 'write it like "8.0;9.0;12.0+PTX"'
SM_HINT = 'write SM numbers without a dot, ";"-separated: "80;90;120"'


@dataclass(frozen=True, order=True)
class Arch:
    """A GPU architecture: compute capability ``major.minor`` and an ``a``/``f`` suffix."""

    major: int
    minor: int
    suffix: Suffix = ""

    @classmethod
    def parse(cls, text: str) -> Arch:
        """``sm_90a``, ``compute_120``, ``lto_90``, ``120f``, ``12.0`` or ``9.0a``; ValueError
        for anything else."""
        text = text.strip()
        if m := _CC.fullmatch(text):
            return cls(int(m.group(1)), int(m.group(2)), _suffix(m.group(3)))
        if m := _NAME.fullmatch(text):
            return cls.from_number(int(m.group(1)), m.group(2))
        raise ValueError(f"{text!r} is not a GPU architecture (expected like sm_90, 9.0 or 12.0a)")

    @classmethod
    def from_number(cls, number: int, suffix: str = "") -> Arch:
        """The arch of an SM number (``90`` -> 9.0, ``120`` -> 12.0) and a suffix."""
        return cls(number // 10, number % 10, _suffix(suffix))

    @property
    def number(self) -> str:
        """The SM-number spelling: ``90a``."""
        return f"{self.major}{self.minor}{self.suffix}"

    @property
    def cc(self) -> str:
        """The compute capability, without the suffix: ``9.0``."""
        return f"{self.major}.{self.minor}"

    @property
    def sass(self) -> str:
        """The cubin name: ``sm_90a``."""
        return f"sm_{self.number}"

    @property
    def ptx(self) -> str:
        """The PTX name: ``compute_90a``."""
        return f"compute_{self.number}"

    def __str__(self) -> str:
        return f"{self.cc}{self.suffix}"


def _suffix(text: str) -> Suffix:
    return "a" if text == "a" else "f" if text == "f" else ""


def runs_on(code: Arch, device: Arch, *, ptx: bool = False) -> bool:
    """Whether code for ``code`` (SASS, or PTX with ``ptx``) runs on a GPU of compute capability
    ``device`` (its suffix is ignored: a GPU has a capability, not a target)."""
    have, need = (device.major, device.minor), (code.major, code.minor)
    if code.suffix == "a":
        return have == need
    if ptx and code.suffix == "":
        return have >= need
    return device.major == code.major and device.minor >= code.minor


@dataclass(frozen=True)
class ArchRequest:
    """One item of an arch list in a build flag: SASS for ``arch``, and PTX too when ``ptx``."""

    variable: str
    text: str
    arch: Arch
    sass: bool = True
    ptx: bool = False

    def covers(self, device: Arch) -> bool:
        """Whether the code this item asks for runs on a GPU of capability ``device``."""
        return (self.sass and runs_on(self.arch, device)) or (
            self.ptx and runs_on(self.arch, device, ptx=True)
        )

    def __str__(self) -> str:
        return f"{self.arch}{'+PTX' if self.ptx else ''}"


@dataclass(frozen=True)
class BadItem:
    """An item of an arch list that the tool reading the list refuses or misreads."""

    variable: str
    text: str
    message: str
    hint: str


def parse_list(
    variable: str, value: str, fmt: ListFormat
) -> tuple[list[ArchRequest], list[BadItem]]:
    """The items of the arch list ``value`` of the build flag ``variable``, read as the tool
    that consumes it reads them (``fmt``: torch's ``TORCH_CUDA_ARCH_LIST`` form or SM numbers),
    and the items that tool would refuse or misread."""
    return _parse_torch(variable, value) if fmt == "torch" else _parse_sm(variable, value)


def _parse_torch(variable: str, value: str) -> tuple[list[ArchRequest], list[BadItem]]:
    if value == "":  # unset: torch picks the archs of the GPUs it sees
        return [], []
    found: list[ArchRequest] = []
    bad: list[BadItem] = []
    for item in value.replace(" ", ";").split(";"):
        if m := _TORCH_ITEM.fullmatch(item):
            found.append(ArchRequest(variable, item, Arch.parse(m.group(1)), True, bool(m[2])))
        elif not item:
            if any(not b.text for b in bad):
                continue  # one message for all the empty items of a list
            bad.append(
                BadItem(
                    variable,
                    item,
                    f"{variable} ({value!r}) has an empty item (a doubled, leading or trailing "
                    "';' or space), which torch refuses",
                    TORCH_HINT,
                )
            )
        else:
            bad.append(BadItem(variable, item, _torch_why(variable, item), TORCH_HINT))
    return found, bad


def _torch_why(variable: str, item: str) -> str:
    said = f"{item!r} in {variable} is not a compute capability"
    if "," in item:
        return f"{said} (torch separates items with ';' or ' ', not ',')"
    if item.lower().endswith("+ptx") and _TORCH_ITEM.fullmatch(item[:-4] + "+PTX"):
        return f"{said} (torch reads '+PTX' in capitals only)"
    if _NAME.fullmatch(item):
        return f"{said} (torch reads {Arch.parse(item)}, not {item})"
    return said


def _parse_sm(variable: str, value: str) -> tuple[list[ArchRequest], list[BadItem]]:
    found: list[ArchRequest] = []
    bad: list[BadItem] = []
    for item in value.split(";"):
        if _SM_ITEM.fullmatch(item):
            found.append(ArchRequest(variable, item, Arch.parse(item)))
        elif item:
            bad.append(BadItem(variable, item, _sm_why(variable, item), SM_HINT))
    return found, bad


def _sm_why(variable: str, item: str) -> str:
    said = f"{item!r} in {variable} is not an SM number"
    if any(c in item for c in ", \t"):
        return f"{said} (the list is split on ';' only; spaces and ',' are kept in its items)"
    if _CC.fullmatch(item) or _NAME.fullmatch(item):
        return f"{said} (write {Arch.parse(item).number})"
    return said


def uncovered(requests: Iterable[ArchRequest], capabilities: Iterable[str]) -> list[str]:
    """The compute capabilities among ``capabilities`` that no item of ``requests`` covers."""
    wanted = list(requests)
    return [cc for cc in capabilities if not any(r.covers(Arch.parse(cc)) for r in wanted)]
