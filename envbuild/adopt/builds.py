"""A distribution no published wheel matches (built on this machine, like flash-attn): what can be
recovered for its ``[builds.<name>]`` entry.

Input: the distribution's installed files (its RECORD) and the environment's torch. Output:
:class:`Rebuild`: the version; the GPU architectures its compiled files hold (the fatbin audit,
:func:`envbuild.sourcebuild.audit.audit_file`), as the build flags the knowledge base says its
build reads (``FLASH_ATTN_CUDA_ARCHS`` for flash-attn, else ``TORCH_CUDA_ARCH_LIST``); and the
torch it links against (a ``DT_NEEDED`` on libtorch or libc10, read by
:func:`envbuild.linkcheck.elf.read_elf`). The flags are the archs found, not the ones asked for
when it was built: the build is named "rebuild needed", never taken as reproduced.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from envbuild.errors import InputFileError
from envbuild.linkcheck.elf import BadElf, is_elf, read_elf
from envbuild.snapshot import records
from envbuild.sourcebuild.audit import audit_file
from envbuild.spec import knowledge
from envbuild.spec.archs import Arch

_TORCH_LIBS = ("libtorch", "libc10")


@dataclass
class Rebuild:
    name: str
    version: str
    reason: str
    sass: list[str] = field(default_factory=list)
    ptx: list[str] = field(default_factory=list)
    torch: str | None = None  # the torch version of the environment, when it links against it
    env: dict[str, str] = field(default_factory=dict)
    has_sdist: bool = False

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "version": self.version,
            "reason": self.reason,
            "sass": self.sass,
            "ptx": self.ptx,
            "torch": self.torch,
            "env": self.env,
            "sdist_on_index": self.has_sdist,
        }


def _elf_files(site: str, record: str) -> list[Path]:
    out = []
    for row in records.rows(record):
        rel = row[0]
        path = Path(os.path.normpath(os.path.join(site, rel)))
        if rel.startswith("..") or not path.is_file() or path.is_symlink():
            continue
        try:
            with path.open("rb") as f:
                if is_elf(f.read(4)):
                    out.append(path)
        except OSError:
            continue
    return sorted(out)


def recover(
    name: str, version: str, site: str, record: str, torch: str | None, reason: str
) -> Rebuild:
    """What the installed files of ``name`` say about how it was built."""
    found = Rebuild(name, version, reason)
    sass: set[str] = set()
    ptx: set[str] = set()
    for path in _elf_files(site, record):
        try:
            audit = audit_file(path, shown=os.path.relpath(path, site))
        except InputFileError:
            continue
        sass.update(audit.sass)
        ptx.update(audit.ptx)
        try:
            with path.open("rb") as f:
                info = read_elf(f)
        except (BadElf, OSError):
            info = None
        if info and torch and any(n.startswith(_TORCH_LIBS) for n in info.needed):
            found.torch = torch
    order = lambda n: Arch.parse(n)  # noqa: E731
    found.sass = sorted(sass, key=order)
    found.ptx = sorted(ptx, key=order)
    found.env = build_env(name, version, found.sass, found.ptx)
    return found


def build_env(name: str, version: str, sass: list[str], ptx: list[str]) -> dict[str, str]:
    """The arch flags that give the archs found, in the form the build reads."""
    if not sass and not ptx:
        return {}
    fact = knowledge.source_build(name, version)
    archs = sorted({Arch.parse(n).cc for n in sass}, key=Arch.parse)
    ptx_only = sorted({Arch.parse(n).cc for n in ptx} - set(archs), key=Arch.parse)
    env: dict[str, str] = {}
    if fact is not None and fact.arch_env and fact.arch_format == "sm":
        numbers = sorted({Arch.parse(n).number.rstrip("af") for n in sass}, key=int)
        env[fact.arch_env] = ";".join(numbers)
    torch_list = [*archs, *(f"{cc}+PTX" for cc in ptx_only)]
    if torch_list:
        env["TORCH_CUDA_ARCH_LIST"] = ";".join(torch_list)
    if fact is not None and fact.force_build_env and fact.force_build_value:
        env[fact.force_build_env] = fact.force_build_value
    return env
