"""The base's part of the lock, from the spec alone (no network).

An image base is already pinned by digest; an OCI layout by the digest the spec gives or, failing
that, the one image its ``index.json`` lists (read by :mod:`envbuild.oci`); a rootfs tarball by
the sha256 the spec gives. A Debian base records its suite, mirror, variant and requested
packages (``include``) here; its resolved package set (``packages``) comes from the base stage
(envbuild.build.base), which resolves it against the mirror with mmdebstrap (see
:mod:`envbuild.lock.pin` for when that runs).
"""

from __future__ import annotations

import logging
from pathlib import Path

from envbuild.errors import InputFileError, SpecError
from envbuild.lock.model import (
    BaseLock,
    DebianBaseLock,
    ImageBaseLock,
    OciLayoutBaseLock,
    RootfsBaseLock,
)
from envbuild.oci.layout import read_index
from envbuild.spec.load import LoadedSpec

log = logging.getLogger(__name__)


def lock_base(loaded: LoadedSpec) -> BaseLock:
    base = loaded.spec.base
    if base.kind == "debian":
        return DebianBaseLock(
            kind="debian",
            suite=base.suite,
            mirror=base.mirror,
            variant=base.variant,
            include=sorted(set(base.packages)),
        )
    if base.kind == "image":
        ref, _, digest = base.ref.partition("@")
        return ImageBaseLock(kind="image", ref=ref, digest=digest)
    path = spec_path(loaded, ("base", "path"), base.path)
    shown = path.relative_to(loaded.root).as_posix()
    if base.kind == "rootfs":
        return RootfsBaseLock(kind="rootfs", path=shown, sha256=base.sha256)
    digest = base.digest or _layout_digest(loaded, path)
    return OciLayoutBaseLock(kind="oci-layout", path=shown, digest=digest)


def debian_request(base: DebianBaseLock) -> tuple[str, str, str, tuple[str, ...]]:
    """What a Debian base's package set is resolved from: suite, mirror, variant, include. Two
    entries with the same request may share one resolved set."""
    return (base.suite, base.mirror, base.variant, tuple(base.include))


def spec_path(loaded: LoadedSpec, key: tuple[str, ...], relative: str) -> Path:
    """A path the spec names at ``key``, resolved against the file that set it."""
    origin = loaded.origins.get(key)
    folder = (origin[0] if origin else loaded.path).parent
    return (folder / relative).resolve()


def _layout_digest(loaded: LoadedSpec, layout: Path) -> str:
    """The digest of the one image ``layout``'s index lists (a referrer, the SBOM, is not an
    image)."""
    index = layout / "index.json"
    try:
        listed = read_index(layout)
    except InputFileError as exc:
        raise SpecError(
            [
                loaded.problem(
                    ("base", "path"),
                    f"{loaded.display(index)} cannot be read as an OCI index ({exc.message})",
                    "point base.path at an OCI image layout, or set base.digest",
                )
            ]
        ) from None
    digests = sorted({d.digest for d in listed.images})
    if len(digests) != 1:
        raise SpecError(
            [
                loaded.problem(
                    ("base", "path"),
                    f"the OCI layout lists {len(digests)} images, so which one is the base "
                    "is ambiguous",
                    "set base.digest to the manifest's digest",
                )
            ]
        )
    return digests[0]
