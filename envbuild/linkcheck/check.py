"""Whether every ELF file of an environment will load: its libraries are there, torch's symbols too.

Input: a :class:`Tree` (the environment's files, each with its distribution, plus the base's
library folders and the host driver's libraries) and the :class:`~envbuild.linkcheck.elf.ElfInfo`
of each ELF file (:mod:`envbuild.linkcheck.reader` reads and caches them). Output: a sorted list
of :class:`Finding`.

A ``DT_NEEDED`` name is found, in the order the dynamic linker looks (ld.so(8)):

1. through the file's ``DT_RPATH`` (when it has no ``DT_RUNPATH``) and ``DT_RUNPATH``, with
   ``$ORIGIN`` the file's own folder;
2. in the environment's own library folders: a library of that file name or SONAME anywhere in
   the environment, which another file's RPATH loads first (``import torch`` loads torch/lib and
   the ``nvidia/*/lib`` of NVIDIA's wheels before any extension, and the linker then matches the
   extension's needs by SONAME);
3. in the base's system library folders;
4. among the host driver's libraries (``libcuda.so.1`` …), which the driver provides at run time.

An extension that links one of torch's libraries (``libtorch*.so``, ``libc10*.so``) has each of
its undefined symbols in torch's namespaces (C++ mangled names mentioning ``c10``, ``at``,
``torch`` or ``caffe2``) looked up in the exports of the libraries it loads (its resolved
``DT_NEEDED`` closure in the environment): mangled names compared exactly; a versioned reference
needs that version. Other undefined symbols are the interpreter's (the Python C API) or the
base's (glibc, libstdc++, versioned against the base) and are not checked here.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from envbuild.linkcheck.facts import ElfInfo, is_torch_symbol

#: torch's libraries whose linking makes a file a torch extension.
TORCH_LIBRARIES = frozenset(
    {
        "libtorch.so",
        "libtorch_cpu.so",
        "libtorch_cuda.so",
        "libtorch_python.so",
        "libc10.so",
        "libc10_cuda.so",
    }
)
#: How many symbols a finding lists demangled.
SHOWN = 5
_TORCH_ORDER = {
    name: i
    for i, name in enumerate(
        ["libtorch_cpu.so", "libc10.so", "libtorch_cuda.so", "libc10_cuda.so", "libtorch_python.so"]
    )
}
_SO_VERSION = re.compile(r"\.so((?:\.\d+)*)$")


@dataclass(frozen=True)
class EnvFile:
    """A file of the environment: ``path`` as the loader sees it (absolute, POSIX), ``dist``
    the distribution that installed it (None when no RECORD lists it)."""

    path: str
    dist: str | None = None
    dist_version: str | None = None


@dataclass(frozen=True)
class Tree:
    """What the check looks at. ``elf`` maps each ELF file's path to what it says;
    ``names``: every other path that exists in the environment (symlinks, non-ELF files);
    ``system_dirs``: the base's library folders in search order, ``system``: the paths present
    there; ``driver``: the host driver's library names; ``torch``: the locked torch version."""

    files: Mapping[str, EnvFile]
    elf: Mapping[str, ElfInfo]
    names: frozenset[str] = frozenset()
    system_dirs: Sequence[str] = ()
    system: frozenset[str] = frozenset()
    driver: frozenset[str] = frozenset()
    driver_version: str | None = None
    torch: str | None = None


@dataclass(frozen=True)
class Finding:
    """One thing that will not load. ``kind`` library: ``missing`` are DT_NEEDED names; kind
    symbols: mangled symbols, ``demangled`` the first few readable."""

    kind: Literal["library", "symbols"]
    dist: str | None
    file: str
    missing: tuple[str, ...]
    looked_in: tuple[str, ...]
    cause: str
    demangled: tuple[str, ...] = field(default=())
    #: whether an import or a program loads the file; False: a plugin only opened on demand
    loaded: bool = True

    @property
    def id(self) -> str:
        """The name a spec accepts it by: ``dist:library`` or ``dist:symbols``."""
        owner = self.dist or self.file
        return f"{owner}:{self.missing[0]}" if self.kind == "library" else f"{owner}:symbols"

    def as_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "kind": self.kind,
            "distribution": self.dist,
            "file": self.file,
            "missing": list(self.missing),
            "demangled": list(self.demangled),
            "looked_in": list(self.looked_in),
            "cause": self.cause,
            "loaded": self.loaded,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        return cls(
            kind=data["kind"],
            dist=data["distribution"],
            file=data["file"],
            missing=tuple(data["missing"]),
            looked_in=tuple(data["looked_in"]),
            cause=data["cause"],
            demangled=tuple(data["demangled"]),
            loaded=bool(data["loaded"]),
        )

    def line(self) -> str:
        what = ", ".join(self.demangled or self.missing[:SHOWN])
        more = len(self.missing) - min(len(self.missing), SHOWN)
        extra = f" and {more} more" if more > 0 else ""
        noun = "needs" if self.kind == "library" else "needs undefined symbols"
        return f"{self.dist or '?'}: {self.file} {noun} {what}{extra} ({self.cause})"


class _Index:
    """Where each library name is, in the environment and the base."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self.present = frozenset(tree.elf) | tree.names
        self.by_name: dict[str, list[str]] = {}
        for path, info in tree.elf.items():
            for name in {posixpath.basename(path), info.soname or ""} - {""}:
                self.by_name.setdefault(name, []).append(path)
        for path in tree.names:
            self.by_name.setdefault(posixpath.basename(path), []).append(path)
        for paths in self.by_name.values():
            paths.sort()
        # every library name by its stem (libcudart.so.12 -> libcudart), for the causes
        self.by_stem: dict[str, set[str]] = {}
        for name in self.by_name:
            self.by_stem.setdefault(_stem(name), set()).add(name)
        for path in tree.system:
            name = posixpath.basename(path)
            self.by_stem.setdefault(_stem(name), set()).add(name)

    def search_dirs(self, path: str, info: ElfInfo) -> list[str]:
        origin = posixpath.dirname(path)
        listed = info.runpath if info.runpath else info.rpath
        out: list[str] = []
        for entry in listed:
            d = entry.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)
            d = (
                posixpath.normpath(d)
                if d.startswith("/")
                else posixpath.normpath(posixpath.join(origin, d))
            )
            if d not in out:
                out.append(d)
        return out

    def resolve(self, path: str, info: ElfInfo, needed: str) -> tuple[str | None, bool]:
        """(the path in the environment it resolves to or None, whether it resolves at all)."""
        if "/" in needed:
            target = posixpath.normpath(posixpath.join(posixpath.dirname(path), needed))
            return (target if target in self.present else None), (
                target in self.present or target in self.tree.system
            )
        for d in self.search_dirs(path, info):
            candidate = posixpath.join(d, needed)
            if candidate in self.present:
                return self._real(candidate), True
            if candidate in self.tree.system:
                return None, True
        if found := self.by_name.get(needed):
            elf = [p for p in found if p in self.tree.elf]
            return (elf[0] if elf else None), True
        for d in self.tree.system_dirs:
            if posixpath.join(d, needed) in self.tree.system:
                return None, True
        return None, needed in self.tree.driver

    def _real(self, candidate: str) -> str | None:
        if candidate in self.tree.elf:
            return candidate
        found = [
            p for p in self.by_name.get(posixpath.basename(candidate), []) if p in self.tree.elf
        ]
        return found[0] if found else None


def is_root(path: str, info: ElfInfo) -> bool:
    """Whether the file is loaded by itself: a program, or a Python extension module (the
    interpreter imports it); a library (``lib*.so``) is loaded only by another file."""
    name = posixpath.basename(path)
    return info.program or (name.endswith(".so") and not name.startswith("lib"))


def check(
    tree: Tree, demangle: Callable[[Sequence[str]], list[str]] | None = None
) -> list[Finding]:
    """Every finding of ``tree``, sorted by file then kind. A finding of a file that no program
    or extension module loads (a plugin opened on demand) has ``loaded`` False."""
    index = _Index(tree)
    pending: list[tuple[str, str]] = []
    resolved: dict[str, list[str]] = {}
    for path in sorted(tree.elf):
        info = tree.elf[path]
        deps: list[str] = []
        for needed in info.needed:
            target, ok = index.resolve(path, info, needed)
            if target is not None and target not in deps:
                deps.append(target)
            if not ok:
                pending.append((path, needed))
        resolved[path] = deps
    # the lookup scope of a file: the load group of every root that loads it (ld.so(8): a
    # dlopen'd object's dependencies resolve in the group of the object opened)
    scopes: dict[str, set[str]] = {}
    for path in sorted(tree.elf):
        if is_root(path, tree.elf[path]):
            group = _closure(path, resolved)
            for member in group:
                scopes.setdefault(member, set()).update(group)
    findings = [
        _missing_library(tree, index, _file(tree, p), tree.elf[p], n, loaded=p in scopes)
        for p, n in pending
    ]
    symbol_findings = []
    for path in sorted(tree.elf):
        info = tree.elf[path]
        if not TORCH_LIBRARIES.intersection(info.needed):
            continue
        scope = sorted(scopes.get(path) or set(_closure(path, resolved)))
        missing = _missing_symbols(tree, path, [p for p in scope if p != path])
        if missing:
            symbol_findings.append((_file(tree, path), missing, scope, path in scopes))
    if symbol_findings:
        shown = [m for _, missing, _, _ in symbol_findings for m in missing[:SHOWN]]
        readable = dict(zip(shown, demangle(shown) if demangle else shown, strict=True))
        for env_file, missing, scope, loaded in symbol_findings:
            findings.append(
                Finding(
                    kind="symbols",
                    dist=env_file.dist,
                    file=env_file.path,
                    missing=tuple(missing),
                    demangled=tuple(readable[m] for m in missing[:SHOWN]),
                    looked_in=tuple(p for p in scope if p != env_file.path),
                    cause=_symbol_cause(tree, env_file),
                    loaded=loaded,
                )
            )
    return sorted(findings, key=lambda f: (f.file, f.kind, f.missing))


def _file(tree: Tree, path: str) -> EnvFile:
    return tree.files.get(path) or EnvFile(path)


def _closure(path: str, resolved: Mapping[str, list[str]]) -> list[str]:
    """``path`` and every library it loads, breadth first (the linker's lookup order)."""
    seen = [path]
    at = 0
    while at < len(seen):
        for dep in resolved.get(seen[at], []):
            if dep not in seen:
                seen.append(dep)
        at += 1
    return seen


def _missing_symbols(tree: Tree, path: str, others: Sequence[str]) -> list[str]:
    # torch's own libraries first: nearly every symbol is found at the first or second look
    ordered = sorted(others, key=lambda p: _TORCH_ORDER.get(posixpath.basename(p), 99))
    scope = [tree.elf[p] for p in ordered]
    out: list[str] = []
    for sym in tree.elf[path].undefined:
        if sym.weak or not is_torch_symbol(sym.name):
            continue
        if sym.version is not None:
            owners = [i for i in scope if i.soname == sym.version_file] or scope
            want = f"{sym.name}@{sym.version}"
            if any(
                want in i.exports or (not i.has_versions and sym.name in i.exports) for i in owners
            ):
                continue
        elif any(sym.name in i.exports for i in scope):
            continue
        out.append(sym.name)
    return sorted(set(out))


def _stem(name: str) -> str:
    return _SO_VERSION.sub("", name)


def _missing_library(
    tree: Tree, index: _Index, env_file: EnvFile, info: ElfInfo, needed: str, *, loaded: bool
) -> Finding:
    dirs = index.search_dirs(env_file.path, info)
    looked = [*dirs, "the environment's library folders", *tree.system_dirs]
    looked.append(f"the host driver's libraries ({tree.driver_version or 'any version'})")
    return Finding(
        kind="library",
        dist=env_file.dist,
        file=env_file.path,
        missing=(needed,),
        looked_in=tuple(looked),
        cause=_library_cause(tree, index, needed, dirs),
        loaded=loaded,
    )


def _library_cause(tree: Tree, index: _Index, needed: str, dirs: Iterable[str]) -> str:
    stem = _stem(needed)
    others = sorted(index.by_stem.get(stem, set()) - {needed})
    if stem == "libcudart" and (m := _SO_VERSION.search(needed)) and m.group(1):
        major = m.group(1).split(".")[1]
        have = ", ".join(others) or "no libcudart"
        return f"built against CUDA {major}; the environment has {have}"
    if stem in {_stem(t) for t in TORCH_LIBRARIES}:
        return f"built for a torch that has {needed}; the locked torch {tree.torch or '?'} has not"
    if others:
        return f"built against {needed}; the environment has {', '.join(others)}"
    foreign = [d for d in dirs if not any(p.startswith(d + "/") for p in index.present)]
    if foreign:
        return (
            f"not in the environment, the base or the driver; its RUNPATH names "
            f"{', '.join(foreign)}, a folder of the machine it was built on"
        )
    return (
        "not in the environment, the base or the driver: "
        "a distribution or system package is missing"
    )


def _symbol_cause(tree: Tree, env_file: EnvFile) -> str:
    torch = tree.torch or "?"
    version = env_file.dist_version or ""
    local = version.partition("+")[2]
    built = f" (its version {version} says {local})" if re.search(r"(pt|torch)\d", local) else ""
    return f"built against another torch than the locked {torch}{built}"
