"""OCI registries as envbuild's shared store: push an image layout, pull one back, verified.

:func:`push` copies an OCI layout to ``REGISTRY/REPO:TAG`` through a :class:`Transport` (skopeo,
else a Docker engine). Before the copy it asks the registry which blobs it already has, so the
result says how many were uploaded and how many were not sent again; after the copy it checks
that the digest the registry reports for the tag is the layout's manifest digest.

:func:`pull` resolves a tag to a digest, copies that digest into a new layout beside ``DIR``,
checks the manifest digest and the sha256 and size of every blob, and only then moves it to
``DIR``: a corrupt or truncated copy never lands.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from envbuild.errors import IntegrityError, OutputError, RegistryError, ToolNotFound
from envbuild.registry.api import Endpoint, RegistryApi
from envbuild.registry.layout import LayoutImage, open_layout, verify_layout
from envbuild.registry.ref import ImageRef, parse_ref, parse_repo
from envbuild.registry.transport import SKOPEO_HINT, Skopeo, Transport

__all__ = [
    "BlobTransfer",
    "Endpoint",
    "ImageRef",
    "PullResult",
    "PushResult",
    "RegistryApi",
    "Transport",
    "get_transport",
    "parse_ref",
    "parse_repo",
    "pull",
    "push",
]

log = logging.getLogger("envbuild.registry")

TransportName = Literal["auto", "skopeo", "docker"]


def get_transport(name: TransportName = "auto") -> Transport:
    """skopeo when installed (or asked for); else the Docker engine through the docker SDK."""
    if name == "skopeo" or (name == "auto" and Skopeo.available()):
        return Skopeo()
    raise ToolNotFound("skopeo", hint=SKOPEO_HINT)


@dataclass(frozen=True)
class BlobTransfer:
    digest: str
    size: int
    media_type: str
    uploaded: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "size": self.size,
            "media_type": self.media_type,
            "uploaded": self.uploaded,
        }


@dataclass(frozen=True)
class PushResult:
    ref: str
    digest: str
    transport: str
    blobs: list[BlobTransfer] = field(default_factory=list)

    @property
    def uploaded(self) -> list[BlobTransfer]:
        return [b for b in self.blobs if b.uploaded]

    @property
    def skipped(self) -> list[BlobTransfer]:
        return [b for b in self.blobs if not b.uploaded]

    @property
    def bytes_uploaded(self) -> int:
        return sum(b.size for b in self.uploaded)

    @property
    def bytes_skipped(self) -> int:
        return sum(b.size for b in self.skipped)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ref": self.ref,
            "digest": self.digest,
            "transport": self.transport,
            "blobs": [b.as_dict() for b in self.blobs],
            "uploaded": len(self.uploaded),
            "skipped": len(self.skipped),
            "bytes_uploaded": self.bytes_uploaded,
            "bytes_skipped": self.bytes_skipped,
        }


@dataclass(frozen=True)
class PullResult:
    ref: str
    digest: str
    path: str
    blobs: int
    size: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "ref": self.ref,
            "digest": self.digest,
            "path": self.path,
            "blobs": self.blobs,
            "size": self.size,
        }


def push_image(
    image: LayoutImage,
    target: ImageRef,
    *,
    endpoint: Endpoint | None = None,
    transport: Transport | None = None,
    api: RegistryApi | None = None,
) -> PushResult:
    """Push an opened (and verified) layout image; see :func:`push`."""
    endpoint = endpoint or Endpoint()
    transport = transport or get_transport()
    api = api or RegistryApi(target.registry, target.repository, endpoint)
    present = {d.digest: api.blob_exists(d.digest) for d in image.blobs}
    blobs = [
        BlobTransfer(d.digest, d.size, d.media_type, not present[d.digest]) for d in image.blobs
    ]
    log.info(
        "pushing %s: %d of %d blobs to upload, %d already in the registry",
        target, sum(b.uploaded for b in blobs), len(blobs), sum(not b.uploaded for b in blobs),
    )  # fmt: skip
    copied = transport.push(image, target, endpoint, api.creds)
    want = image.manifest.digest
    if transport.name == "skopeo" and copied != want:
        raise IntegrityError(f"the copy of {target} reports digest {copied}, the layout has {want}")
    reported = api.manifest_digest(target.reference)
    if reported != copied:
        raise IntegrityError(
            f"registry {target.registry} reports digest {reported} for {target}, "
            f"the pushed manifest is {copied}",
            hint="another push to the same tag may have raced this one; push again",
        )
    return PushResult(str(target), copied, transport.name, blobs)


def push(
    layout: Path,
    target: ImageRef,
    *,
    tag: str | None = None,
    endpoint: Endpoint | None = None,
    transport: Transport | None = None,
) -> PushResult:
    """Push the image of the OCI layout ``layout`` (named ``tag`` there, or its only one) to
    ``target`` (``REGISTRY/REPO:TAG``)."""
    if target.digest is not None or target.tag is None:
        raise RegistryError(f"{target}: push needs a tag (REGISTRY/REPO:TAG), not a digest")
    image = open_layout(layout, tag)
    verify_layout(image)  # never send bytes that are not what the manifest promises
    return push_image(image, target, endpoint=endpoint, transport=transport)


def _check_dest(dest: Path) -> None:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise OutputError(
            f"{dest} already exists and is not an empty folder",
            hint="pull into a new folder, or remove this one first",
        )
    if not dest.parent.is_dir():
        raise OutputError(f"cannot write {dest}: {dest.parent} does not exist")


def pull(
    source: ImageRef,
    dest: Path,
    *,
    endpoint: Endpoint | None = None,
    transport: Transport | None = None,
    api: RegistryApi | None = None,
) -> PullResult:
    """Pull ``source`` (``REGISTRY/REPO[:TAG|@DIGEST]``) into a new OCI layout at ``dest``."""
    endpoint = endpoint or Endpoint()
    shown, dest = str(dest), Path(dest).absolute()
    _check_dest(dest)
    transport = transport or get_transport()
    api = api or RegistryApi(source.registry, source.repository, endpoint)
    digest = api.manifest_digest(source.reference)
    if digest is None:
        raise RegistryError(
            f"registry {source.registry} has no image {source}",
            hint="check the repository and tag (or digest)",
            status=404,
        )
    if source.digest is not None and digest != source.digest:
        raise IntegrityError(f"registry {source.registry} answered {digest} for {source}")
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.pull-", dir=dest.parent))
    try:
        layout = tmp / "layout"
        transport.pull(source.pinned(digest), layout, endpoint, api.creds, source.tag)
        image = open_layout(layout, source.tag)
        if image.manifest.digest != digest:
            raise IntegrityError(
                f"the pulled manifest is {image.manifest.digest}, the registry named {digest}"
            )
        verify_layout(image)
        if dest.exists():
            dest.rmdir()
        os.replace(layout, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("pulled %s (%s) into %s, every blob verified", source, digest, dest)
    return PullResult(str(source), digest, shown, len(image.blobs), image.size)
