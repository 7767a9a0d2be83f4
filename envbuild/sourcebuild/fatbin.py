"""Reading the device code nvcc embeds in a compiled file: ELF sections and fatbin entry headers.

nvcc puts device code in an ELF section of the host object: ``.nv_fatbin`` (whole-program code)
or ``__nv_relfatbin`` (relocatable ``-rdc`` code). The section holds one or more fatbin
containers; each is a 16-byte header (magic ``0xBA55ED50``, version, header size, payload size)
followed by entries, each with its own header: kind (1 = PTX, 2 = ELF cubin i.e. SASS, 8 =
LTO-IR), the SM number (``90`` for 9.0), flags (bit 0x100000 arch-specific ``a``, bit 0x200000
family-specific ``f``, bit 0x2000/0x8000 LZ4/zstd-compressed payload) and the payload. Only the
entry headers are read: they are never compressed, so no decompressor is needed. The layout was
checked against objects built with nvcc 13.0 for many ``-gencode`` combinations and against
``cuobjdump --list-elf/--list-ptx`` (see tests/sourcebuild/test_audit.py).

Input: the bytes of a file (or an mmap). Output: :class:`FatbinEntry` values, or :class:`NotElf`
for a file that is no ELF. Which code runs where is :mod:`envbuild.spec.archs`'s business, what a
wheel holds :mod:`envbuild.sourcebuild.audit`'s.
"""

from __future__ import annotations

import logging
import mmap
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from envbuild.spec.archs import Arch

log = logging.getLogger(__name__)

FATBIN_MAGIC = 0xBA55ED50
FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")
KIND_PTX, KIND_ELF, KIND_LTO = 1, 2, 8
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_FAMILY_SPECIFIC = 0x200000
FLAG_COMPRESSED = 0x2000 | 0x8000


@dataclass(frozen=True)
class FatbinEntry:
    """One entry of a fatbin container: its kind (PTX, SASS, LTO-IR), arch and flags."""

    kind: int
    arch: Arch
    flags: int

    @property
    def compressed(self) -> bool:
        """Whether the entry's payload is LZ4- or zstd-compressed (its header never is)."""
        return bool(self.flags & FLAG_COMPRESSED)


class NotElf(ValueError):
    """The bytes are not an ELF file this reader understands."""


def entry_arch(number: int, flags: int) -> Arch:
    """The arch of an entry's SM number, its ``a``/``f`` suffix taken from the entry's flags."""
    suffix = "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY_SPECIFIC else ""
    return Arch.from_number(number, suffix)


def elf_sections(data: bytes | mmap.mmap, names: Iterable[str]) -> dict[str, bytes]:
    """The contents of the named sections of an ELF file (any class, either byte order)."""
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise NotElf("not an ELF file")
    klass, order = data[4], data[5]
    if klass not in (1, 2) or order not in (1, 2):
        raise NotElf("unknown ELF class or byte order")
    e = "<" if order == 1 else ">"
    if klass == 2:
        (shoff,) = struct.unpack_from(e + "Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from(e + "HHH", data, 0x3A)
        sh_fmt = e + "IIQQQQ"
    else:
        (shoff,) = struct.unpack_from(e + "I", data, 0x20)
        shentsize, shnum, shstrndx = struct.unpack_from(e + "HHH", data, 0x2E)
        sh_fmt = e + "IIIIII"
    if shoff == 0:
        return {}

    def header(i: int) -> tuple[int, int, int, int]:
        at = shoff + i * shentsize
        if at + struct.calcsize(sh_fmt) > len(data):
            raise NotElf("section header table is truncated")
        raw = struct.unpack_from(sh_fmt, data, at)
        return raw[0], raw[1], raw[4], raw[5]

    if shnum == 0 or shstrndx == 0xFFFF:  # extended numbering: the real values sit in section 0
        at = shoff
        zero = struct.unpack_from(e + ("IIQQQQII" if klass == 2 else "IIIIIIII"), data, at)
        shnum = shnum or zero[5]
        shstrndx = zero[6] if shstrndx == 0xFFFF else shstrndx
    _, _, str_off, str_size = header(shstrndx)
    strtab = bytes(data[str_off : str_off + str_size])
    wanted = set(names)
    out: dict[str, bytes] = {}
    for i in range(shnum):
        name_at, sh_type, offset, size = header(i)
        end = strtab.find(b"\0", name_at)
        name = strtab[name_at : end if end >= 0 else None].decode("latin-1")
        if name in wanted and sh_type != 8:  # SHT_NOBITS holds no bytes
            out[name] = bytes(data[offset : offset + size])
    return out


def fatbin_entries(blob: bytes) -> Iterator[FatbinEntry]:
    """Every entry of every fatbin container in ``blob`` (a ``.nv_fatbin`` section's bytes)."""
    at = 0
    while at + 16 <= len(blob):
        magic, _version, header_size, payload = struct.unpack_from("<IHHQ", blob, at)
        if magic != FATBIN_MAGIC:
            at += 8  # containers are 8-byte aligned; skip padding between them
            continue
        entry, end = at + header_size, min(at + header_size + payload, len(blob))
        while entry + 64 <= end:
            kind, _, entry_size, size = struct.unpack_from("<HHIQ", blob, entry)
            sm, *_ = struct.unpack_from("<I", blob, entry + 0x1C)
            (flags,) = struct.unpack_from("<Q", blob, entry + 0x28)
            if entry_size < 64:
                break
            yield FatbinEntry(kind, entry_arch(sm, flags), flags)
            entry += entry_size + size
        at = max(end, at + 16)
