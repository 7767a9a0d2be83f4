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

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from envbuild import scratch
from envbuild.engine import ContainerEngine, DockerEngine
from envbuild.errors import IntegrityError, OutputError, RegistryError, ToolNotFound
from envbuild.oci.blobs import verify_layout
from envbuild.oci.layout import OCI_MANIFEST, LayoutImage, open_layout
from envbuild.registry.api import Endpoint, RegistryApi
from envbuild.registry.ref import ImageRef, parse_ref, parse_repo
from envbuild.registry.referrers import pull_referrers, push_referrers
from envbuild.registry.transport import SKOPEO_HINT, Copied, Skopeo, Transport

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

log = logging.getLogger(__name__)

TransportName = Literal["auto", "skopeo", "docker"]
#: Artifacts a pull brings along with the image: its CycloneDX SBOM.
PULLED_ARTIFACTS = ("application/vnd.cyclonedx+json",)


def get_transport(name: TransportName = "auto", engine: ContainerEngine | None = None) -> Transport:
    """skopeo when installed (or asked for); else the container engine ``engine`` (default: the
    Docker engine at the default socket) when it answers, or when asked for."""
    if name == "skopeo" or (name == "auto" and Skopeo.available()):
        return Skopeo()
    from envbuild.registry.engine import EngineTransport

    engine = engine or DockerEngine()
    if name == "docker" or engine.available():
        return EngineTransport(engine)
    raise ToolNotFound("skopeo", hint=SKOPEO_HINT)


def diff_ids(config: bytes) -> list[str]:
    """The uncompressed digests of an image's layers, from its config."""
    return [str(d) for d in json.loads(config).get("rootfs", {}).get("diff_ids", [])]


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
    referrers: list[str] = field(default_factory=list)  # artifacts pushed with it (the SBOM)

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
            "referrers": self.referrers,
        }


@dataclass(frozen=True)
class PullResult:
    ref: str
    digest: str  # the registry's manifest digest
    path: str
    blobs: int
    size: int
    layout_digest: str  # the pulled layout's (differs only through an engine: layers unpacked)
    referrers: list[str] = field(default_factory=list)  # artifacts pulled with it (the SBOM)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ref": self.ref,
            "digest": self.digest,
            "layout_digest": self.layout_digest,
            "path": self.path,
            "blobs": self.blobs,
            "size": self.size,
            "referrers": self.referrers,
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
    if transport.preserves_digests:
        log.info(
            "pushing %s: %d of the image's %d blobs to upload, %d already in the registry",
            target, sum(b.uploaded for b in blobs), len(blobs), sum(not b.uploaded for b in blobs),
        )  # fmt: skip
    else:
        log.info("pushing %s through the %s engine", target, transport.name)
    copied = transport.push(image, target, endpoint, api.creds)
    reported = api.manifest_digest(target.reference)
    if reported != copied.digest:
        raise IntegrityError(
            f"registry {target.registry} reports digest {reported} for {target}, "
            f"the pushed manifest is {copied.digest}",
            hint="another push to the same tag may have raced this one; push again",
        )
    sent: list[tuple[dict[str, Any], bool]] = []
    if transport.preserves_digests:
        if copied.digest != image.manifest.digest:
            raise IntegrityError(
                f"the copy of {target} has digest {copied.digest}, the layout's is "
                f"{image.manifest.digest}"
            )
        referrers = push_referrers(api, image.root, copied.digest, sent=sent)
    else:
        raw = api.manifest_bytes(copied.digest)
        remote = json.loads(raw)
        blobs = _engine_blobs(image, remote, copied, present)
        # what refers to the image (its SBOM) names the layout's manifest; the registry holds
        # the engine's (same config and content, other layer digests): point it at that one
        pushed_as = {
            "mediaType": str(remote.get("mediaType") or OCI_MANIFEST),
            "digest": copied.digest,
            "size": len(raw),
        }
        referrers = push_referrers(
            api, image.root, image.manifest.digest, pushed_as=pushed_as, sent=sent
        )
    # the artifacts' blobs (the SBOM and its config) went up too: count them with the image's
    blobs += [
        BlobTransfer(str(b["digest"]), int(b["size"]), str(b["mediaType"]), up)
        for b, up in sent
        if all(b["digest"] != x.digest for x in blobs)
    ]
    return PushResult(str(target), copied.digest, transport.name, blobs, referrers)


def _engine_blobs(
    image: LayoutImage, pushed: dict[str, Any], copied: Copied, present: dict[str, bool]
) -> list[BlobTransfer]:
    """An engine recompresses layers: check it kept our config (which pins every layer's
    content by diff_id) and account for the layers as the registry now has them."""
    config = pushed.get("config") or {}
    if config.get("digest") != image.config.digest:
        raise IntegrityError(
            f"the engine pushed config {config.get('digest')}, the layout's is "
            f"{image.config.digest}: the image changed on the way"
        )
    ids = diff_ids(image.blob_path(image.config).read_bytes())
    sent = copied.uploaded_by_diff_id or {}
    blobs = [BlobTransfer(image.config.digest, image.config.size, image.config.media_type,
                          not present[image.config.digest])]  # fmt: skip
    for diff_id, layer in zip(ids, pushed.get("layers") or [], strict=True):
        short = diff_id.split(":", 1)[1][:12]
        uploaded = sent.get(short, True)
        blobs.append(
            BlobTransfer(
                str(layer["digest"]), int(layer["size"]), str(layer["mediaType"]), uploaded
            )
        )
    return blobs


def layout_of(path: Path) -> Path:
    """The OCI layout ``path`` names: itself, or the ``oci/`` of a build's output folder (so
    push takes the folder load takes)."""
    path = Path(path)
    if not (path / "oci-layout").exists() and (path / "oci" / "oci-layout").is_file():
        return path / "oci"
    return path


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
    image = open_layout(layout_of(layout), tag)
    verify_layout(image)  # never send bytes that are not what the manifest promises
    return push_image(image, target, endpoint=endpoint, transport=transport)


def _check_engine_pull(image: LayoutImage, remote: dict[str, Any]) -> None:
    """An engine writes layers uncompressed: each must hash to the diff_id the (unchanged)
    config names."""
    want = (remote.get("config") or {}).get("digest")
    if image.config.digest != want:
        raise IntegrityError(
            f"the engine saved config {image.config.digest}, the registry's is {want}"
        )
    ids = diff_ids(image.blob_path(image.config).read_bytes())
    if ids != [d.digest for d in image.layers]:
        raise IntegrityError("the engine's layers do not match the diff_ids of the image config")


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
    with scratch.beside(dest, "pull-") as tmp:
        layout = tmp / "layout"
        transport.pull(source.pinned(digest), layout, endpoint, api.creds, source.tag)
        image = open_layout(layout, source.tag)
        if transport.preserves_digests:
            if image.manifest.digest != digest:
                raise IntegrityError(
                    f"the pulled manifest is {image.manifest.digest}, the registry named {digest}"
                )
        else:
            _check_engine_pull(image, api.manifest(digest))
        verify_layout(image)
        referrers = pull_referrers(api, digest, layout, PULLED_ARTIFACTS)
        if dest.exists():
            dest.rmdir()
        os.replace(layout, dest)
    log.debug("pulled %s (%s) into %s, every blob verified", source, digest, dest)
    return PullResult(
        str(source), digest, shown, len(image.blobs), image.size, image.manifest.digest,
        referrers,
    )  # fmt: skip
