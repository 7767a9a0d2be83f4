"""The link check: every ELF file of an environment finds its libraries and torch's symbols.

The commonest start-up failure of a GPU Python environment is no resolver conflict but
``libcudart.so.12: cannot open shared object file`` or ``undefined symbol: _ZN3c10…`` from an
extension built against another CUDA or torch than the one installed. This package finds those
before anything runs:

* :mod:`envbuild.linkcheck.elf` reads one file's dynamic-linking facts (pyelftools);
* :mod:`envbuild.linkcheck.reader` reads many in parallel, cached by sha256;
* :mod:`envbuild.linkcheck.check` resolves them over a :class:`~check.Tree` into findings;
* this module makes the tree of a folder on disk (a live venv, a build's extracted
  environment) with the base's library folders and the driver's libraries, and runs the three.
"""

from __future__ import annotations

import csv
import io
import os
import posixpath
import re
import shutil
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from packaging.utils import canonicalize_name

from envbuild.errors import EnvironmentFailure
from envbuild.linkcheck.check import SHOWN, EnvFile, Finding, Tree, check
from envbuild.linkcheck.reader import Cache, default_cache, read_all, tree_key
from envbuild.proc import core as proc

__all__ = [
    "DriverLibraries",
    "EnvFile",
    "Finding",
    "Report",
    "check_folder",
    "demangle",
    "driver_libraries",
    "system_listing",
]

#: The base's library folders when its ld.so.conf names none (Debian's multiarch layout first).
SYSTEM_DIRS = (
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/local/lib",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
)
_LIBRARY_NAME = re.compile(r"\.so(?:\.[^/]*)?$")  # libssl-81259c47.so.1.1.1k too
_NOT_ELF = (".py", ".pyc", ".pyi", ".h", ".hpp", ".cuh", ".json", ".txt", ".typed", ".md")


@dataclass(frozen=True)
class DriverLibraries:
    names: frozenset[str]
    driver: str
    source: str


@cache
def driver_libraries() -> DriverLibraries:
    """The host driver's libraries, from the data file beside this module."""
    data = tomllib.loads((Path(__file__).parent / "driver_libraries.toml").read_text())
    return DriverLibraries(
        names=frozenset([*data["sonames"], *data["names"]]),
        driver=str(data["driver"]),
        source=str(data["source"]),
    )


@dataclass
class Report:
    """What a link check found: ``findings`` not accepted, ``accepted`` with the spec's reason."""

    findings: list[Finding]
    accepted: list[tuple[Finding, str]] = field(default_factory=list)
    #: findings of plugins no import or program loads (opened on demand): reported, not failing
    optional: list[Finding] = field(default_factory=list)
    checked: int = 0  # ELF files looked at
    unreadable: dict[str, str] = field(default_factory=dict)
    cache_hits: int = 0
    cache_misses: int = 0

    @property
    def ok(self) -> bool:
        return not self.findings

    def as_dict(self) -> dict[str, object]:
        return {
            "checked": self.checked,
            "findings": [f.as_dict() for f in self.findings],
            "accepted": [{**f.as_dict(), "reason": why} for f, why in self.accepted],
            "optional": [f.as_dict() for f in self.optional],
            "unreadable": dict(sorted(self.unreadable.items())),
        }


def demangle(names: Sequence[str]) -> list[str]:
    """C++ names made readable by binutils' c++filt, one call for all; the mangled names as
    they are when c++filt is not there or fails."""
    tool = shutil.which("c++filt")
    if not names or tool is None:
        return list(names)
    try:  # through proc.run, like every child: stopped with envbuild on a signal
        done = proc.run([tool], input="\n".join(names) + "\n", check=False, timeout=60)
    except (OSError, EnvironmentFailure):
        return list(names)
    out = done.stdout.splitlines()
    return out if done.returncode == 0 and len(out) == len(names) else list(names)


def system_listing(
    root: str, dirs: Sequence[str] | None = None
) -> tuple[list[str], frozenset[str]]:
    """The library folders of the system at ``root`` (``/`` for this machine) — those its
    ld.so.conf names, then :data:`SYSTEM_DIRS` — and the paths in them."""
    listed = [*_ld_so_conf(root), *(dirs or SYSTEM_DIRS)]
    order = list(dict.fromkeys(posixpath.normpath(d) for d in listed))
    present: set[str] = set()
    for d in order:
        try:
            with os.scandir(_under(root, d)) as it:
                present.update(posixpath.join(d, e.name) for e in it)
        except OSError:
            continue
    return order, frozenset(present)


def _under(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _ld_so_conf(root: str, name: str = "/etc/ld.so.conf", depth: int = 0) -> Iterator[str]:
    try:
        text = Path(_under(root, name)).read_text(errors="replace")
    except OSError:
        return
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("include ") and depth < 4:
            pattern = line.split(None, 1)[1]
            base = Path(_under(root, posixpath.dirname(pattern)))
            leaf = posixpath.basename(pattern)
            for match in sorted(base.glob(leaf)) if base.is_dir() else []:
                yield from _ld_so_conf(root, "/" + str(match.relative_to(root)), depth + 1)
        elif line.startswith("/"):
            yield line


def _owners(root: str, prefix: str) -> dict[str, tuple[str, str]]:
    """``{path in the environment: (distribution, version)}`` from every RECORD under
    ``prefix``'s site-packages folders."""
    out: dict[str, tuple[str, str]] = {}
    top = _under(root, prefix)
    root_dir = posixpath.normpath(root).rstrip("/") + "/"
    top_is_root = root_dir == "/"
    for site in sorted(Path(top).glob("lib*/python*/site-packages")):
        site_dir = str(site)
        for record in sorted(site.glob("*.dist-info/RECORD")):
            name, _, version = record.parent.name.removesuffix(".dist-info").partition("-")
            dist = canonicalize_name(name)
            try:
                text = record.read_text(errors="replace")
            except OSError:
                continue
            for line in text.splitlines():
                # the path, without csv's cost for the plain rows (a quoted one goes through csv)
                path = line.rsplit(",", 2)[0] if not line.startswith('"') else None
                if path is None:
                    try:
                        path = next(csv.reader(io.StringIO(line)))[0]
                    except (csv.Error, StopIteration, IndexError):
                        continue
                # only what may be ELF (the rest never becomes a finding's owner)
                if not path or path.endswith(_NOT_ELF):
                    continue
                real = posixpath.normpath(posixpath.join(site_dir, path))
                out[real if top_is_root else "/" + real[len(root_dir) :]] = (dist, version)
    return out


def _candidates(root: str, prefix: str) -> tuple[dict[str, str], set[str]]:
    """``{path in the environment: path here}`` of the files that may be ELF (a library name;
    or executable, among files without a suffix or in a ``bin`` folder), and the paths of the
    symlinks (whose names count for the lookup)."""
    files: dict[str, str] = {}
    names: set[str] = set()
    top = _under(root, prefix).rstrip("/")
    skip = len(root.rstrip("/"))
    todo = [top]
    while todo:
        here = todo.pop()
        try:
            with os.scandir(here) as it:
                entries = list(it)
        except OSError:
            continue
        in_bin = here.endswith("/bin")
        for e in entries:
            full = f"{here}/{e.name}"
            try:
                if e.is_symlink():
                    names.add(full[skip:] or "/")
                elif e.is_dir():
                    if e.name != "__pycache__":
                        todo.append(full)
                elif e.is_file() and (
                    _LIBRARY_NAME.search(e.name)
                    or ((in_bin or "." not in e.name) and e.stat().st_mode & 0o111)
                ):
                    files[full[skip:]] = full
            except OSError:
                continue
    return files, names


def check_folder(
    root: str,
    prefix: str,
    *,
    system_root: str = "/",
    system: tuple[Sequence[str], frozenset[str]] | None = None,
    torch: str | None = None,
    accept: Mapping[str, str] | None = None,
    cache: Cache | None = None,
    digests: Mapping[str, str] | None = None,
) -> Report:
    """Check the environment under ``prefix`` of the tree at ``root`` (a live venv: root ``/``
    and its own path). ``system`` is the base's library folders and listing (default: read at
    ``system_root``); ``accept`` maps finding ids to the spec's reasons; ``digests`` (path on
    this machine -> sha256) names files whose bytes are known, so they are not hashed."""
    files, names = _candidates(root, prefix)
    known = digests or {}
    return check_entries(
        {env: (here, known.get(here)) for env, here in files.items()},
        names=frozenset(names),
        owners=_owners(root, prefix),
        system=system if system is not None else system_listing(system_root),
        torch=torch,
        accept=accept,
        cache=cache,
        tree_key=tree_key(root + prefix),
    )


def check_entries(
    entries: Mapping[str, tuple[str | None, str | None]],
    *,
    names: frozenset[str],
    owners: Mapping[str, tuple[str, str]],
    system: tuple[Sequence[str], frozenset[str]],
    torch: str | None = None,
    accept: Mapping[str, str] | None = None,
    cache: Cache | None = None,
    tree_key: str | None = None,
) -> Report:
    """The link check of an environment given as ``{path in it: (path here or None, sha256 or
    None)}`` for the files that may be ELF (the "sha256" is a cache key: a wheel member's is
    :func:`~envbuild.linkcheck.wheels.member_key`); ``names`` the other paths in it; ``owners``
    the distribution and version of each path."""
    if torch is None:
        torch = next((v for d, v in owners.values() if d == "torch"), None)
    cache = cache if cache is not None else Cache(default_cache())
    got = read_all(entries, cache=cache, tree_key=tree_key)
    elf = got.elf
    others = names | frozenset(entries.keys() - elf.keys())
    dirs, listing = system
    drivers = driver_libraries()
    env_files = {env: EnvFile(env, *(owners.get(env) or (None, None))) for env in elf}
    tree = Tree(
        files=env_files,
        elf=elf,
        names=others,
        system_dirs=tuple(dirs),
        system=listing,
        driver=drivers.names,
        driver_version=drivers.driver,
        torch=torch,
    )
    found = check(tree, demangle)
    accept = accept or {}
    return Report(
        findings=[f for f in found if f.id not in accept and f.loaded],
        accepted=[(f, accept[f.id]) for f in found if f.id in accept],
        optional=[f for f in found if f.id not in accept and not f.loaded],
        checked=len(elf),
        unreadable=dict(got.unreadable),
        cache_hits=got.hits,
        cache_misses=got.misses,
    )


__all__ += ["SHOWN", "Cache", "check_entries", "default_cache"]
