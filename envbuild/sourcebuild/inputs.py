"""A source build's key: its inputs, and what changed since the last build of the distribution.

:func:`inputs_of` is what decides the wheel's bytes, and nothing else: the sdist (its sha256 from
the lock), the exact torch it builds against (version and wheel sha256), the Python version, the
compilers as found (gcc, g++, nvcc), the declared build flags (``FLASH_ATTENTION_FORCE_BUILD``
forced for flash-attn, so it never fetches a prebuilt wheel), the build requirements, the build
venv's locked pins (:mod:`envbuild.lock.closure`), the knowledge base's sdist patches
(:func:`sdist_patches`) and the builder's identity; no host path, secret or time. Their canonical
JSON names the derivation (:func:`build_key`, the one place the key is made from them, for a
build and for every lookup that asks whether one is needed). ``MAX_JOBS`` and
``NVCC_THREADS`` (:data:`SPEED_ENV`) change the build's speed, not its output: never inputs.

:func:`diff_inputs` compares two input sets as dotted keys, a list item by item
(``constraints: torch==2.14.0 -> torch==2.14.1``); :func:`previous_build` finds what to compare
with.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from pydantic import BaseModel, ConfigDict, Field

from envbuild.fsio import sha256_file
from envbuild.lock.closure import EXTRA_REQUIRES
from envbuild.sourcebuild.builder import Builder, Toolchain
from envbuild.sourcebuild.requests import KIND, SourceBuildRequest
from envbuild.spec import knowledge
from envbuild.store.core import Derivation, Store, derivation_key

log = logging.getLogger(__name__)

#: Flags that decide how fast a build runs, not what it makes: passed to the build, recorded in
#: the derivation's meta, never inputs of its key (a wheel built with MAX_JOBS=2 is the one a
#: 16-job build makes; nvcc's --threads only splits the per-arch work across threads).
SPEED_ENV = frozenset({"MAX_JOBS", "NVCC_THREADS"})
#: Where the knowledge base's sdist patches live (``[[source_patches]]``).
SOURCE_PATCHES = Path(__file__).resolve().parents[1] / "spec" / "source-patches"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InputChange(_Model):
    """One input that differs. For a list input (``constraints``, ``requires``) each added,
    removed or changed item is a change of its own, ``item`` true and ``old``/``new`` the
    items (None: not there)."""

    key: str = Field(description="dotted path of the input")
    old: Any = None
    new: Any = None
    item: bool = Field(False, description="old and new are items of the list input key")

    def render(self) -> str:
        if not self.item:
            return f"{self.key}: {_short(self.old)} -> {_short(self.new)}"
        if self.old is None:
            return f"{self.key}: added {self.new}"
        if self.new is None:
            return f"{self.key}: removed {self.old}"
        return f"{self.key}: {self.old} -> {self.new}"


def _short(value: Any) -> str:
    """A value as a change shows it: leaves (strings, numbers) whole, so two long values that
    differ at their end still read as different; only a whole list or table is cut."""
    text = repr(value)
    if not isinstance(value, list | dict) or len(text) <= 200:
        return text
    return text[:197] + "..."


def inputs_of(req: SourceBuildRequest, toolchain: Toolchain, builder: Builder) -> dict[str, Any]:
    """The derivation inputs: what decides the wheel's bytes (no host path, no secret, no time)."""
    requires = sorted({*req.requires, *EXTRA_REQUIRES.get(canonicalize_name(req.dist), [])})
    patched = {"source_patches": [p.model_dump() for p in sdist_patches(req)]}
    return {
        "dist": canonicalize_name(req.dist),
        "version": req.version,
        "sdist": {"name": req.sdist.name, "sha256": req.sdist.sha256},
        "torch": req.torch.model_dump() if req.torch else None,
        "python": toolchain.python,
        "compilers": dict(sorted(toolchain.compilers.items())),
        "env": {k: v for k, v in sorted(req.build_env.items()) if k not in SPEED_ENV},
        "requires": requires,
        "constraints": sorted(req.constraints),
        "exclude_newer": req.exclude_newer,
        "builder": builder.identity(),
        **(patched if patched["source_patches"] else {}),
    }


def build_key(req: SourceBuildRequest, toolchain: Toolchain, builder: Builder) -> str:
    """The store key of ``req`` built with ``toolchain`` by ``builder``: the source-build
    derivation of :func:`inputs_of` (what :func:`envbuild.sourcebuild.realize.realize` builds
    under, and what the store, its remote cache or a plan is asked about)."""
    return derivation_key(KIND, inputs_of(req, toolchain, builder))


class SdistPatch(_Model):
    """A patch envbuild applies to the unpacked sdist (a ``[[source_patches]]`` fact)."""

    name: str
    sha256: str


def sdist_patches(req: SourceBuildRequest) -> list[SdistPatch]:
    """The knowledge base's patches for ``req``'s sdist against its locked torch, with their
    sha256 (inputs of the key): what the real build showed the package's setup.py needs."""
    torch = req.torch.version if req.torch else None
    return [
        SdistPatch(name=f.patch, sha256=sha256_file(SOURCE_PATCHES / f.patch))
        for f in knowledge.source_patches(req.dist, req.version, torch)
    ]


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out or {prefix: {}}
    return {prefix: value}


def _item_id(item: str) -> str:
    """What names a requirement or pin in a list (``torch==2.14.0 ; marker`` -> ``torch ;
    marker``), so that a new version of it reads as a change, not a removal and an addition."""
    spec, _, marker = item.partition(";")
    name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
    head = canonicalize_name(name.group(1)) if name else spec.strip()
    return f"{head} ;{' '.join(marker.split())}" if marker.strip() else head


def _diff_items(key: str, old: list[str], new: list[str]) -> list[InputChange]:
    a = {_item_id(i): i for i in old}
    b = {_item_id(i): i for i in new}
    if len(a) != len(old) or len(b) != len(new):  # two items with one name: compare whole items
        a, b = {i: i for i in old}, {i: i for i in new}
    return [
        InputChange(key=key, old=a.get(i), new=b.get(i), item=True)
        for i in sorted(set(a) | set(b))
        if a.get(i) != b.get(i)
    ]


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(i, str) for i in value)


def diff_inputs(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[InputChange]:
    """Which inputs differ, as dotted keys (``env.FLASH_ATTN_CUDA_ARCHS``), sorted. A list of
    strings (requirements, pins) is compared item by item: ``constraints: torch==2.14.0 ->
    torch==2.14.1``, ``constraints: added sympy==1.14.0``."""
    a, b = _flatten(dict(old)), _flatten(dict(new))
    out: list[InputChange] = []
    for k in sorted(set(a) | set(b)):
        before, after = a.get(k), b.get(k)
        if before == after:
            continue
        if _strings(before if before is not None else []) and _strings(
            after if after is not None else []
        ):
            out += _diff_items(k, before or [], after or [])
        else:
            out.append(InputChange(key=k, old=before, new=after))
    return out


def previous_build(
    store: Store, dist: str, *, kind: str = KIND, not_key: str = ""
) -> Derivation | None:
    """The last derivation of ``kind`` recorded for ``dist`` (by record time), but ``not_key``."""
    best: tuple[int, Derivation] | None = None
    wanted = canonicalize_name(dist)
    for key in store.derivations():
        if key == not_key:
            continue
        path = store.drvs / f"{key}.json"
        try:
            drv = Derivation.model_validate_json(path.read_bytes())
            stamp = path.stat().st_mtime_ns
        except (OSError, ValueError):
            continue
        if (
            drv.kind == kind
            and drv.inputs.get("dist") == wanted
            and (best is None or stamp > best[0])
        ):
            best = (stamp, drv)
    return best[1] if best else None
