"""What one ELF file asks of the dynamic linker, and what it offers: read with pyelftools.

:func:`read_elf` returns an :class:`ElfInfo`: the file's ``DT_NEEDED``, ``DT_RPATH``,
``DT_RUNPATH`` and ``DT_SONAME``; its undefined symbols in torch's namespaces (each with the
version it requires and the file that version belongs to, from ``.gnu.version_r``); and its
exports (defined global and weak symbols of default or protected visibility, each under its
plain name when it is the default version and as ``name@VERSION`` for every version it has,
from ``.gnu.version_d``).

pyelftools reads the headers, the sections, the dynamic tags and the version tables. The symbol
table itself is decoded in bulk with :func:`struct.iter_unpack` over the section's bytes (its
entries are fixed-size records): pyelftools' one-object-per-symbol decoding takes seconds on
torch's libraries, which export hundreds of thousands of symbols. Only the dynamic sections are
read (``.dynamic``, ``.dynsym``, ``.dynstr``, ``.gnu.version*``): never code or debug info.

A file that is not ELF, is not for the host's kind of machine (a cubin, an object file) or has no
dynamic section gives None. A malformed ELF file gives :class:`BadElf`, never a traceback.
"""

from __future__ import annotations

import struct
from typing import IO, Any

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection, GNUVerSymSection

from envbuild.linkcheck.facts import ElfInfo, Undefined, is_torch_symbol

MAGIC = b"\x7fELF"
#: Machines whose shared objects a CPU loads (x86-64, AArch64); cubins (EM_CUDA) are not.
HOST_MACHINES = frozenset({"EM_X86_64", "EM_AARCH64"})
#: An ELF file is read only up to this many bytes of dynamic tables (a bound on hostile input).
MAX_TABLE_BYTES = 512 << 20

_STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE = 1, 2, 10
_STT_SECTION, _STT_FILE = 3, 4
_STV_DEFAULT, _STV_PROTECTED = 0, 3
_VERSYM_HIDDEN = 0x8000


class BadElf(Exception):
    """The file starts like ELF but its headers or tables cannot be read."""


def is_elf(head: bytes) -> bool:
    return head[:4] == MAGIC


def read_elf(stream: IO[bytes]) -> ElfInfo | None:
    """The dynamic-linking facts of the ELF file ``stream`` (seekable), None when it is not a
    host shared object or executable with a dynamic section."""
    head = stream.read(4)
    stream.seek(0)
    if not is_elf(head):
        return None
    size = stream.seek(0, 2)
    stream.seek(0)
    try:
        elf = ELFFile(stream)
        # a section count the file cannot hold (extended numbering allows 2**32) is a lie
        if elf.num_sections() * max(elf["e_shentsize"], 1) > size:
            raise BadElf(f"{elf.num_sections()} section headers do not fit in {size} bytes")
        return _read(elf)
    except (ELFError, struct.error, ValueError, KeyError, IndexError, OverflowError) as exc:
        raise BadElf(str(exc) or type(exc).__name__) from exc
    except (AttributeError, TypeError, AssertionError, UnicodeDecodeError) as exc:
        # pyelftools meets a truncated or inconsistent table with these too
        raise BadElf(f"{type(exc).__name__}: {exc}") from exc


def _read(elf: ELFFile) -> ElfInfo | None:
    if elf.header["e_machine"] not in HOST_MACHINES or elf.header["e_type"] not in (
        "ET_DYN",
        "ET_EXEC",
    ):
        return None
    sections = {s["sh_type"]: s for s in elf.iter_sections() if s["sh_type"] in _WANTED}
    dynamic = sections.get("SHT_DYNAMIC")
    if not isinstance(dynamic, DynamicSection):
        return None
    info = ElfInfo(program=any(seg["p_type"] == "PT_INTERP" for seg in elf.iter_segments()))
    for tag in dynamic.iter_tags():
        kind = tag.entry.d_tag
        if kind == "DT_NEEDED":
            info.needed.append(_text(tag, "needed"))
        elif kind == "DT_SONAME":
            info.soname = _text(tag, "soname")
        elif kind == "DT_RPATH":
            info.rpath.extend(p for p in _text(tag, "rpath").split(":") if p)
        elif kind == "DT_RUNPATH":
            info.runpath.extend(p for p in _text(tag, "runpath").split(":") if p)
    symtab = sections.get("SHT_DYNSYM")
    if symtab is None:
        return info
    for kind, entry in (("SHT_GNU_verdef", 20), ("SHT_GNU_verneed", 16)):
        # pyelftools walks sh_info entries, a count the file states: a wrong one (and a zero
        # "next" offset) would have it yield the same entry four billion times
        listed = sections.get(kind)
        if listed is not None and listed["sh_info"] > max(listed["sh_size"], 0) // entry:
            raise BadElf(f"{kind} claims {listed['sh_info']} entries in {listed['sh_size']} bytes")
    defined: dict[int, str] = {}
    verdef = sections.get("SHT_GNU_verdef")
    if isinstance(verdef, GNUVerDefSection):
        for vd, auxes in verdef.iter_versions():
            aux = next(iter(auxes), None)
            if aux is not None and not vd["vd_flags"] & 0x1:  # VER_FLG_BASE: the file's name
                defined[vd["vd_ndx"]] = aux.name
        info.has_versions = bool(defined)
    required: dict[int, tuple[str, str]] = {}
    verneed = sections.get("SHT_GNU_verneed")
    if isinstance(verneed, GNUVerNeedSection):
        for vn, auxes in verneed.iter_versions():
            for aux in auxes:
                required[aux["vna_other"]] = (aux.name, vn.name or "")
    strtab = _data(elf.get_section(symtab["sh_link"]))
    table = _data(symtab)
    versym = sections.get("SHT_GNU_versym")
    versions = (
        _versyms(_data(versym), elf.little_endian) if isinstance(versym, GNUVerSymSection) else None
    )
    exports: set[str] = set()
    undefined: list[Undefined] = []
    for index, (name_at, info_byte, other, shndx) in enumerate(_symbols(table, elf)):
        if index == 0 or not name_at:
            continue
        bind, kind = info_byte >> 4, info_byte & 0xF
        if bind not in (_STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE) or kind in (
            _STT_SECTION,
            _STT_FILE,
        ):
            continue
        end = strtab.find(b"\0", name_at)
        name = strtab[name_at : end if end >= 0 else len(strtab)].decode("utf-8", "replace")
        ver = versions[index] if versions is not None and index < len(versions) else 1
        if shndx == 0:  # SHN_UNDEF: needed from elsewhere; only torch's are checked
            if not is_torch_symbol(name):
                continue
            need = required.get(ver & 0x7FFF)
            undefined.append(
                Undefined(
                    name, need[0] if need else None, need[1] if need else None, bind == _STB_WEAK
                )
            )
            continue
        if other & 0x3 not in (_STV_DEFAULT, _STV_PROTECTED):
            continue
        version = defined.get(ver & 0x7FFF)
        if not ver & _VERSYM_HIDDEN:
            exports.add(name)
        if version is not None:
            exports.add(f"{name}@{version}")
    info.undefined = undefined
    info.export_source = frozenset(exports)
    return info


_WANTED = frozenset(
    {"SHT_DYNAMIC", "SHT_DYNSYM", "SHT_GNU_verdef", "SHT_GNU_verneed", "SHT_GNU_versym"}
)


def _text(tag: Any, name: str) -> str:
    """A string-valued dynamic tag's text (pyelftools sets it as an attribute of that name)."""
    return str(getattr(tag, name))


def _data(section: Any) -> bytes:
    if section["sh_type"] == "SHT_NOBITS":
        return b""
    if section["sh_size"] > MAX_TABLE_BYTES:
        raise BadElf(f"section {section.name or '?'} is {section['sh_size']} bytes")
    data = section.data()
    if len(data) != section["sh_size"]:
        raise BadElf(f"section {section.name or '?'} is cut short")
    return bytes(data)


def _symbols(table: bytes, elf: ELFFile) -> list[tuple[int, int, int, int]]:
    """(st_name, st_info, st_other, st_shndx) of each entry of a symbol table's bytes."""
    end = "<" if elf.little_endian else ">"
    if elf.elfclass == 64:  # Elf64_Sym: name, info, other, shndx, value, size
        fmt, pick = end + "IBBHQQ", (0, 1, 2, 3)
    else:  # Elf32_Sym: name, value, size, info, other, shndx
        fmt, pick = end + "IIIBBH", (0, 3, 4, 5)
    size = struct.calcsize(fmt)
    usable = len(table) - len(table) % size
    a, b, c, d = pick
    return [(e[a], e[b], e[c], e[d]) for e in struct.iter_unpack(fmt, table[:usable])]


def _versyms(data: bytes, little: bool) -> list[int]:
    usable = len(data) - len(data) % 2
    return list(struct.unpack(("<" if little else ">") + f"{usable // 2}H", data[:usable]))
