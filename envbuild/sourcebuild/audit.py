"""What GPU code a compiled file really holds: the SASS and PTX architectures in its fatbins.

Build flags (``TORCH_CUDA_ARCH_LIST``, ``FLASH_ATTN_CUDA_ARCHS``) are intent; this module reports
the fact. Input: a wheel, a folder or one compiled file. Output: an :class:`Audit`, one
:class:`ObjectAudit` per ELF file with the SASS, PTX and LTO-IR architectures its fatbins hold
(read from the bytes by :mod:`envbuild.sourcebuild.fatbin`, or by ``cuobjdump`` when given one),
stored in the source build's derivation and checked against the target GPUs.

Which code runs on which GPU is one rule, :func:`envbuild.spec.archs.runs_on` (CUDA's binary,
PTX and feature-set compatibility), the same that spec validation and the toolchain check use.

LTO-IR (``code=lto_90``) is listed but never counts: the driver does not JIT it.
"""

from __future__ import annotations

import functools
import logging
import mmap
import os
import re
import struct
import tomllib
import zipfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from envbuild import scratch
from envbuild.errors import InputFileError
from envbuild.proc import core as proc
from envbuild.sourcebuild.fatbin import (
    FATBIN_SECTIONS,
    KIND_ELF,
    KIND_LTO,
    KIND_PTX,
    NotElf,
    elf_sections,
    fatbin_entries,
)
from envbuild.spec.archs import Arch, runs_on

log = logging.getLogger(__name__)

# --- the typed result ------------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ObjectAudit(_Model):
    """The device code of one compiled file. Empty lists: a host-only file (a plain C extension)."""

    path: str = Field(description="the file, relative to what was audited (a wheel, a folder)")
    sass: list[str] = Field(default_factory=list, description="cubin architectures, like sm_90a")
    ptx: list[str] = Field(default_factory=list, description="PTX architectures, like compute_120")
    lto: list[str] = Field(default_factory=list, description="LTO-IR (never runs on its own)")

    @property
    def has_device_code(self) -> bool:
        return bool(self.sass or self.ptx or self.lto)

    def runs_on(self, cc: str) -> str | None:
        """How this file's kernels run on compute capability ``cc``: ``"sm_90 SASS"``,
        ``"compute_80 PTX (JIT)"``, or None when they cannot."""
        device = Arch.parse(cc)
        for name in self.sass:
            if runs_on(Arch.parse(name), device):
                return f"{name} SASS"
        for name in self.ptx:
            if runs_on(Arch.parse(name), device, ptx=True):
                return f"{name} PTX (JIT)"
        return None

    @property
    def code_elsewhere(self) -> str | None:
        """Why this file's fatbin does not tell where its kernels run (they live outside it,
        :data:`DEVICE_CODE_FACTS`), or None when the fatbin is the whole story."""
        return outside_fatbin(self.path)

    def verdict(self, cc: str) -> Literal["runs", "cannot run", "unknown", "no GPU code"]:
        """Whether this file's kernels run on compute capability ``cc``."""
        if self.code_elsewhere is not None:
            return "unknown"
        if not self.has_device_code:
            return "no GPU code"
        return "runs" if self.runs_on(cc) is not None else "cannot run"

    def missing(self, ccs: Iterable[str]) -> list[str]:
        """The compute capabilities among ``ccs`` this file's kernels cannot run on (none for a
        file whose kernels live outside its fatbin: unknown is not "cannot run")."""
        if not self.has_device_code or self.code_elsewhere is not None:
            return []
        return sorted({cc for cc in ccs if self.runs_on(cc) is None}, key=Arch.parse)


class Audit(_Model):
    """Every compiled file of a wheel or a folder, with its GPU code."""

    tool: Literal["fatbin", "cuobjdump"] = "fatbin"
    files: list[ObjectAudit] = Field(default_factory=list)

    @property
    def sass(self) -> list[str]:
        return _union(f.sass for f in self.files)

    @property
    def ptx(self) -> list[str]:
        return _union(f.ptx for f in self.files)

    def missing(self, ccs: Iterable[str]) -> dict[str, list[str]]:
        """``{file: [compute capabilities it cannot run on]}`` for the files that lack some."""
        wanted = list(ccs)
        return {f.path: gone for f in self.files if (gone := f.missing(wanted))}

    def unknown(self) -> dict[str, str]:
        """``{file: why}`` for the files whose kernels the fatbin cannot account for."""
        return {f.path: why for f in self.files if (why := f.code_elsewhere) is not None}

    def summary(self) -> str:
        gpu = [f for f in self.files if f.has_device_code]
        return (
            f"{len(self.files)} compiled file(s), {len(gpu)} with GPU code; "
            f"SASS {', '.join(self.sass) or 'none'}; PTX {', '.join(self.ptx) or 'none'}"
        )


DEVICE_CODE_FACTS = Path(__file__).resolve().parent / "device_code.toml"


@functools.cache
def _outside_fatbin() -> list[tuple[re.Pattern[str], str]]:
    data = tomllib.loads(DEVICE_CODE_FACTS.read_text(encoding="utf-8"))
    entries = data["outside_fatbin"]
    return [(re.compile(e["name"]), f"{e['library']}: {e['reason']}") for e in entries]


def outside_fatbin(path: str) -> str | None:
    """Why the kernels of the file at ``path`` may live outside its fatbin, or None."""
    name = path.replace("\\", "/").rsplit("/", 1)[-1]
    for pattern, why in _outside_fatbin():
        if pattern.search(name):
            return why
    return None


def _union(lists: Iterable[list[str]]) -> list[str]:
    return sorted({a for items in lists for a in items}, key=Arch.parse)


def _sorted_names(arches: Iterable[str]) -> list[str]:
    return sorted(set(arches), key=Arch.parse)


# --- auditing files --------------------------------------------------------------------------


def audit_bytes(data: bytes | mmap.mmap, path: str) -> ObjectAudit:
    """The audit of one ELF file's bytes. Raises :class:`NotElf` for anything else."""
    sass, ptx, lto = set(), set(), set()
    for blob in elf_sections(data, FATBIN_SECTIONS).values():
        for entry in fatbin_entries(blob):
            if entry.kind == KIND_PTX:
                ptx.add(entry.arch.ptx)
            elif entry.kind == KIND_LTO:
                lto.add(f"lto_{entry.arch.number}")
            elif entry.kind == KIND_ELF:
                sass.add(entry.arch.sass)
    return ObjectAudit(
        path=path, sass=_sorted_names(sass), ptx=_sorted_names(ptx), lto=_sorted_names(lto)
    )


def audit_file(path: Path, *, shown: str | None = None, tool: str | None = None) -> ObjectAudit:
    """The audit of one compiled file; with ``tool`` (a cuobjdump binary), ask cuobjdump instead."""
    shown = shown or path.name
    if tool:
        return _cuobjdump(path, shown, tool)
    try:
        with path.open("rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                raise InputFileError(path, "is empty, not a compiled object")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return audit_bytes(data, shown)
    except NotElf as exc:
        raise InputFileError(path, f"cannot be audited: {exc}") from None
    except (struct.error, IndexError) as exc:
        raise InputFileError(path, f"is a damaged ELF file ({exc})") from None
    except OSError as exc:
        raise InputFileError(path, f"cannot be read: {exc.strerror}") from None


def _is_elf(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def audit_tree(root: Path, *, tool: str | None = None) -> Audit:
    """Audit every ELF file under ``root`` (extensions, shared libraries, objects)."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    audits = [
        audit_file(p, shown=p.relative_to(root).as_posix(), tool=tool) for p in files if _is_elf(p)
    ]
    return Audit(tool="cuobjdump" if tool else "fatbin", files=audits)


def audit_wheel(wheel: Path, *, tool: str | None = None) -> Audit:
    """Audit every ELF member of a wheel (each is unpacked to a temporary file, one at a time)."""
    audits: list[ObjectAudit] = []
    try:
        with zipfile.ZipFile(wheel) as zf:
            for info in sorted(zf.infolist(), key=lambda i: i.filename):
                if info.is_dir():
                    continue
                with zf.open(info) as member:
                    if member.read(4) != b"\x7fELF":
                        continue
                with _unpacked(zf, info) as tmp:
                    audits.append(audit_file(tmp, shown=info.filename, tool=tool))
    except zipfile.BadZipFile as exc:
        raise InputFileError(wheel, f"is not a wheel (zip): {exc}") from None
    except FileNotFoundError:
        raise InputFileError(wheel, "no such file") from None
    return Audit(tool="cuobjdump" if tool else "fatbin", files=audits)


@contextmanager
def _unpacked(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> Iterator[Path]:
    with scratch.temp_dir("audit-") as tmp:
        target = Path(tmp) / Path(info.filename).name
        with zf.open(info) as src, target.open("wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        yield target


# --- cuobjdump, where present (toolchain.find_cuobjdump finds one) --------------------------

_CUOBJ_LINE = re.compile(
    r"^(ELF|PTX) file\s+\d+:\s+\S*?\.(?:sm|compute)_(\d+[af]?)\.(?:cubin|ptx)\s*$"
)


def _cuobjdump(path: Path, shown: str, tool: str) -> ObjectAudit:
    sass: set[str] = set()
    ptx: set[str] = set()
    for flag in ("--list-elf", "--list-ptx"):
        done = proc.run([tool, "-all", flag, path], tool="cuobjdump", check=False)
        for line in (done.stdout + done.stderr).splitlines():
            m = _CUOBJ_LINE.match(line.strip())
            if m:
                arch = Arch.parse(m.group(2))
                (sass if m.group(1) == "ELF" else ptx).add(
                    arch.sass if m.group(1) == "ELF" else arch.ptx
                )
    return ObjectAudit(path=shown, sass=_sorted_names(sass), ptx=_sorted_names(ptx))
