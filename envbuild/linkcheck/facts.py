"""What the link check knows of one ELF file: plain data, cached by the file's sha256 (read by
:mod:`envbuild.linkcheck.elf`, which needs pyelftools; a warm check never imports it)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: A mangled name in torch's namespaces (a length-prefixed c10/at/torch/caffe2 component).
_TORCH_NS = re.compile(r"(?<![0-9])(?:3c10|2at|5torch|6caffe2)(?=[0-9A-Z_])")


def is_torch_symbol(name: str) -> bool:
    """Whether a symbol is C++ in torch's namespaces (the undefined symbols the check keeps:
    the rest are the interpreter's, the Python C API, or the base's, versioned against it)."""
    return name.startswith("_Z") and _TORCH_NS.search(name) is not None


@dataclass(frozen=True)
class Undefined:
    """A symbol a file needs from another: its version and the file that version is from (the
    ``.gnu.version_r`` entry), None when unversioned; ``weak`` ones may stay unresolved."""

    name: str
    version: str | None = None
    version_file: str | None = None
    weak: bool = False


@dataclass
class ElfInfo:
    soname: str | None = None
    needed: list[str] = field(default_factory=list)
    rpath: list[str] = field(default_factory=list)
    runpath: list[str] = field(default_factory=list)
    undefined: list[Undefined] = field(default_factory=list)
    has_versions: bool = False  # whether the file defines symbol versions at all
    program: bool = False  # it names a program interpreter (an executable, not only a library)
    #: the exports, or how to load them (a cache entry's: only files whose symbols are needed)
    export_source: frozenset[str] | Callable[[], frozenset[str]] = frozenset()

    @property
    def exports(self) -> frozenset[str]:
        if callable(self.export_source):
            self.export_source = self.export_source()
        return self.export_source

    def as_dict(self) -> dict[str, Any]:
        return {
            "soname": self.soname,
            "needed": self.needed,
            "rpath": self.rpath,
            "runpath": self.runpath,
            "undefined": [[u.name, u.version, u.version_file, u.weak] for u in self.undefined],
            "has_versions": self.has_versions,
            "program": self.program,
        }

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], exports: frozenset[str] | Callable[[], frozenset[str]]
    ) -> ElfInfo:
        return cls(
            soname=data["soname"],
            needed=list(data["needed"]),
            rpath=list(data["rpath"]),
            runpath=list(data["runpath"]),
            undefined=[Undefined(n, v, f, bool(w)) for n, v, f, w in data["undefined"]],
            export_source=exports,
            has_versions=bool(data["has_versions"]),
            program=bool(data["program"]),
        )
