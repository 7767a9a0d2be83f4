"""Wheels that do not come from an index: source builds and patched wheels, from the store.

The lock names them (``tool.envbuild.builds`` and ``tool.envbuild.patches``); a
:class:`WheelProvider` turns each into a wheel file in the store, building it if the store does
not have it yet (which needs a CUDA toolkit: preflight asks :meth:`WheelProvider.missing` first).
"""

from __future__ import annotations

import hashlib
import logging
import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.utils import canonicalize_name

from envbuild.apply.generations import Generation
from envbuild.apply.inputs import ApplyInput
from envbuild.apply.venv import WHEELS, StoreWheel
from envbuild.errors import EnvbuildError, EnvironmentFailure, UserError
from envbuild.spec.load import LoadedSpec
from envbuild.store.core import Store, default_store

if TYPE_CHECKING:
    from envbuild.sourcebuild.sources import RealizedWheel

log = logging.getLogger(__name__)


def wanted(inp: ApplyInput) -> list[str]:
    """Distributions whose wheel must come from the store, sorted."""
    names = {canonicalize_name(b.name) for b in inp.lock.envbuild.builds}
    names |= {canonicalize_name(n) for n, patches in inp.lock.envbuild.patches.items() if patches}
    return sorted(names)


class WheelProvider(ABC):
    @abstractmethod
    def missing(self, inp: ApplyInput) -> dict[str, bool]:
        """Source builds the store does not have yet (they will be compiled) -> whether the
        build needs a CUDA toolkit."""

    @abstractmethod
    def stored(self, inp: ApplyInput) -> dict[str, StoreWheel] | None:
        """The wheels :meth:`provide` would give, if the store already holds every one of them
        (derivation lookups only: nothing is built, fetched or patched); else None."""

    @abstractmethod
    def provide(self, inp: ApplyInput) -> dict[str, StoreWheel]:
        """A wheel for every name :func:`wanted` gives, building what is missing."""

    def keep(self, generation: Generation) -> None:
        """Keep what ``generation``'s ``wheels/`` links point to alive (a store root)."""
        return None

    def release(self, generation: Generation) -> None:
        """``generation`` was removed: let go of what only it kept alive."""
        return None


def root_name(generation: Generation) -> str:
    """The store root of a generation: its folder's name, made unique per state dir (two
    ``--root``s on one machine may hold generations of the same content)."""
    where = hashlib.sha256(str(generation.path.parent.resolve()).encode()).hexdigest()[:12]
    return f"apply-{where}-{generation.name}"


def linked_blobs(generation: Generation) -> list[str]:
    """The store blobs (``sha256:<hex>``) the generation's ``wheels/`` links point to."""
    folder = generation.path / WHEELS
    if not folder.is_dir():
        return []
    out = []
    for link in sorted(folder.iterdir()):
        target = Path(os.readlink(link)) if link.is_symlink() else None
        if target is not None and target.parent.name == "sha256" and len(target.name) == 64:
            out.append(f"sha256:{target.name}")
    return out


class IndexOnly(WheelProvider):
    """For locks that need no store wheel; refuses the others clearly."""

    def missing(self, inp: ApplyInput) -> dict[str, bool]:
        return {b.name: True for b in inp.lock.envbuild.builds}

    def stored(self, inp: ApplyInput) -> dict[str, StoreWheel] | None:
        return None if wanted(inp) else {}

    def provide(self, inp: ApplyInput) -> dict[str, StoreWheel]:
        if names := wanted(inp):
            raise UserError(
                f"{inp.lock_path} needs wheels built by envbuild ({', '.join(names)}), and no "
                "store is configured for this apply",
            )
        return {}


class StoreWheels(WheelProvider):
    """Source builds (built on this machine's host) and patched wheels, kept in envbuild's store
    (with a remote cache in front of it, a :class:`~envbuild.store.remote.CachedStore`), realized
    as ``envbuild build`` realizes them (:mod:`envbuild.sourcebuild.sources`)."""

    def __init__(self, store: Store | None = None) -> None:
        self._store = store

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = default_store()
        return self._store

    def _loaded(self, inp: ApplyInput) -> LoadedSpec:
        if inp.loaded is None:
            raise UserError(
                f"{inp.origin}: source builds and patches need the spec file and its patches",
                hint="apply the spec itself (from its repository)",
            )
        return inp.loaded

    def missing(self, inp: ApplyInput) -> dict[str, bool]:
        if not inp.lock.envbuild.builds:
            return {}
        from envbuild.sourcebuild.builder import HostBuilder
        from envbuild.sourcebuild.inputs import build_key
        from envbuild.sourcebuild.requests import build_requests

        builder = HostBuilder(inp.spec.python.version)
        out = {}
        for req in build_requests(self._loaded(inp), inp.lock):
            try:
                toolchain = builder.probe(cuda=req.needs_cuda)
            except EnvironmentFailure:
                out[req.dist] = req.needs_cuda  # no compiler: it cannot be in the store
                continue
            # in this store, or in the remote cache in front of it (nothing to compile then)
            if not self.store.available(build_key(req, toolchain, builder)):
                out[req.dist] = req.needs_cuda
        return out

    def stored(self, inp: ApplyInput) -> dict[str, StoreWheel] | None:
        if not wanted(inp):
            return {}
        if inp.loaded is None:
            return None
        from envbuild.sourcebuild.builder import HostBuilder
        from envbuild.sourcebuild.sources import stored_sources

        try:
            builder = HostBuilder(inp.spec.python.version)
            found = stored_sources(inp.loaded, inp.lock, self.store, builder)
        except EnvbuildError as exc:
            log.debug("store wheels not looked up: %s", exc.message)
            return None
        return None if found is None else {d: self._wheel(r) for d, r in found.items()}

    def provide(self, inp: ApplyInput) -> dict[str, StoreWheel]:
        """The build's own path (:func:`envbuild.sourcebuild.sources.realize_sources`): each
        wheel from this store, else from the remote cache in front of it, else built here."""
        if not wanted(inp):
            return {}
        from envbuild.sourcebuild.builder import HostBuilder
        from envbuild.sourcebuild.sources import realize_sources

        version = inp.spec.python.version
        made = realize_sources(
            self._loaded(inp), inp.lock, self.store, lambda: HostBuilder(version)
        )
        return {dist: self._wheel(r) for dist, r in made.wheels.items()}

    def keep(self, generation: Generation) -> None:
        """A store root naming the generation's wheels and the source-build and patch
        derivations that made them, so ``envbuild gc`` neither breaks its ``wheels/`` links nor
        makes the next apply of the spec compile again."""
        blobs = linked_blobs(generation)
        if not blobs:
            return
        from envbuild.sourcebuild.patches import KIND as PATCH_KIND
        from envbuild.sourcebuild.requests import KIND as BUILD_KIND

        store, linked = self.store, set(blobs)
        keys = [
            key
            for key in store.derivations()
            if (drv := store.lookup(key)) is not None
            and drv.kind in (BUILD_KIND, PATCH_KIND)
            and drv.outputs.get("wheel") in linked
        ]
        store.set_root(root_name(generation), blobs=blobs, derivations=keys)
        log.debug("store root %s keeps %d wheel(s)", root_name(generation), len(blobs))

    def release(self, generation: Generation) -> None:
        name = root_name(generation)
        if self.store.remove_root(name):
            log.debug("store root %s removed with its generation", name)

    def _wheel(self, realized: RealizedWheel) -> StoreWheel:
        wheel = realized.wheel
        return StoreWheel(
            dist=canonicalize_name(realized.dist),
            version=wheel.version,
            filename=wheel.filename,
            path=realized.path,
            sha256=wheel.sha256,
            size=wheel.size,
        )
