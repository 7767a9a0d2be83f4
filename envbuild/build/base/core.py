"""The bottom of an image: a Debian package set, a registry image, a local OCI layout or rootfs.

Use::

    base = build_base(store, loaded, lock.tool.envbuild.base)   # -> BaseImage
    base.layers, base.config, base.history, base.lock           # lock: the BaseLock to record
    resolve_debian(store, spec_base) -> DebianBaseLock           # for ``envbuild lock``

Each kind is a derivation in the store, keyed by what pins it (the Debian package set with its
.deb hashes, the registry manifest digest, the tarball's sha256), so a base is fetched or built
once per store. Reading a base never writes outside its target (:mod:`envbuild.build.base.tarsafe`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envbuild.build.base import debian, registry, rootfs
from envbuild.build.base.model import DEFAULT_PATH, BaseImage
from envbuild.build.base.tarsafe import Limits
from envbuild.build.layers import Compression
from envbuild.lock.base import lock_base
from envbuild.lock.model import (
    BaseLock,
    DebianBaseLock,
    ImageBaseLock,
    OciLayoutBaseLock,
    RootfsBaseLock,
)
from envbuild.proc import core as proc
from envbuild.store.core import Store

__all__ = ["DEFAULT_PATH", "BaseImage", "build_base", "resolve_debian"]


def build_base(
    store: Store,
    loaded: Any,
    lock: BaseLock | None = None,
    *,
    compression: Compression = Compression.ZSTD,
    tls_verify: bool = True,
    sde: int = 0,
) -> BaseImage:
    """The base ``loaded.spec.base`` names. A Debian base is built from the package set ``lock``
    pins (resolved against its mirror first when there is none: see ``BaseImage.lock``); the
    other kinds are pinned by the spec itself (digest, sha256). ``tls_verify=False`` lets a
    registry base come from a plain-HTTP registry (tests). ``sde``: the mtime of what is built
    here (a Debian rootfs, a tarball's layer): the plan's SOURCE_DATE_EPOCH."""
    spec_base = loaded.spec.base
    if spec_base.kind == "debian":
        pinned = lock if isinstance(lock, DebianBaseLock) else None
        return debian.build(store, spec_base, pinned, compression=compression, sde=sde)
    pin = lock_base(loaded)
    limits = Limits.of(spec_base.max_unpacked_gib)
    if isinstance(pin, ImageBaseLock):
        return registry.pull(store, pin, tls_verify=tls_verify, limits=limits)
    root = Path(loaded.root)
    if isinstance(pin, OciLayoutBaseLock):
        return rootfs.from_oci_layout(store, root / pin.path, pin, limits=limits)
    assert isinstance(pin, RootfsBaseLock)
    return rootfs.from_tarball(
        store, root / pin.path, pin, compression=compression, limits=limits, sde=sde
    )


def resolve_debian(store: Store, spec_base: Any) -> DebianBaseLock:
    """Resolve a Debian base's package set against its mirror (runs mmdebstrap once; the rootfs
    is kept in the store as the build of that pinned set). The lock stage's
    :class:`~envbuild.lock.pin.BasePinner` is given this as its ``resolver``."""
    proc.which("mmdebstrap", hint=debian.HINT)
    return debian.resolve(store, spec_base)
