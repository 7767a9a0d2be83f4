"""The base stage: the base's layers, config and history from the store, built or pulled once
per store (:mod:`envbuild.build.base`), as a :class:`~envbuild.build.manifest.BaseResult`.

A Debian base whose lock names no package set is resolved against the mirror once per store
too (a derivation of the base's spec and the lock's cutoff).
"""

from __future__ import annotations

import logging

from envbuild import progress
from envbuild.build import layers
from envbuild.build.manifest import BaseResult
from envbuild.fsio import canonical_json
from envbuild.lock.model import DebianBaseLock, Lock
from envbuild.spec import LoadedSpec
from envbuild.store.core import Output, Store

log = logging.getLogger(__name__)


def base_stage(
    loaded: LoadedSpec,
    lock: Lock,
    store: Store,
    compression: layers.Compression,
    sde: int,
) -> BaseResult:
    """The base's layers from the store, built or pulled once per store (see
    envbuild.build.base), a built one's mtimes ``sde`` (the plan's SOURCE_DATE_EPOCH)."""
    kept: list[str] = []
    from envbuild.build.base.core import build_base

    pinned = lock.envbuild.base
    if isinstance(pinned, DebianBaseLock) and not pinned.packages:
        pinned = _debian_resolution(loaded, lock, store, (compression, sde), kept)
    with progress.task(f"base {loaded.spec.base.kind}", None, unit="layers"):
        got = build_base(store, loaded, pinned, compression=compression, sde=sde)
    return BaseResult(
        layers=list(got.layers),
        config=got.config,
        history=list(got.history),
        info={
            "key": got.key,
            "lock": got.lock.model_dump(mode="json", by_alias=True),
            **({} if got.setid is None else {"setid": got.setid}),
        },
        keys=kept,
    )


def _debian_resolution(
    loaded: LoadedSpec,
    lock: Lock,
    store: Store,
    packing: tuple[layers.Compression, int],
    kept: list[str],
) -> DebianBaseLock:
    """A lock whose Debian base names no package set is resolved against the mirror once per
    store (a derivation of the base's spec and the lock's cutoff), not at every build: neither a
    no-op rebuild nor a bumped Python package runs mmdebstrap again. Pinning the set in the lock
    itself makes it the same on every machine."""
    from envbuild.build.base import debian

    spec_base = loaded.spec.base
    locked = lock.envbuild
    inputs = {
        "base": spec_base.model_dump(mode="json"),
        "locked": locked.base.model_dump(mode="json") if locked.base else None,
        "exclude_newer": locked.exclude_newer.isoformat(),
    }

    def produce() -> Output:
        compression, sde = packing
        resolved = debian.resolve(store, spec_base, compression=compression, sde=sde)
        data = canonical_json(resolved.model_dump(mode="json", by_alias=True)).encode()
        return Output(outputs={"lock": store.add_bytes(data)})

    drv = store.realize("debian-resolution", inputs, produce).drv
    kept.append(drv.key)
    return DebianBaseLock.model_validate_json(store.read_blob(drv.outputs["lock"]))
