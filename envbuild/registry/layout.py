"""OCI image layouts on disk (image-spec ``image-layout.md``): read one image out of a layout,
verify every byte of it against its digests, and write a small artifact layout.

Only what push, pull and the remote cache need; building image layouts is
:mod:`envbuild.build.image`'s.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbuild.errors import InputFileError, IntegrityError
from envbuild.fsio import compact_json, sha256_bytes, sha256_file, write_atomic

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
REF_NAME = "org.opencontainers.image.ref.name"
TITLE = "org.opencontainers.image.title"


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    annotations: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Any, where: Path) -> Descriptor:
        try:
            return cls(
                media_type=str(data.get("mediaType", "")),
                digest=str(data["digest"]),
                size=int(data["size"]),
                annotations=dict(data.get("annotations") or {}),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InputFileError(where, f"has a malformed descriptor: {data!r}") from exc

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mediaType": self.media_type,
            "digest": self.digest,
            "size": self.size,
        }
        if self.annotations:
            out["annotations"] = dict(sorted(self.annotations.items()))
        return out

    @property
    def hex(self) -> str:
        return self.digest.split(":", 1)[1]


@dataclass(frozen=True)
class LayoutImage:
    """One image (or artifact) manifest in an OCI layout, with its config and layers."""

    root: Path
    manifest: Descriptor
    document: dict[str, Any]
    config: Descriptor
    layers: tuple[Descriptor, ...]

    def blob_path(self, desc: Descriptor) -> Path:
        algo, hexdigest = desc.digest.split(":", 1)
        return self.root / "blobs" / algo / hexdigest

    @property
    def blobs(self) -> tuple[Descriptor, ...]:
        """Every blob the manifest references: config first, then the layers."""
        return (self.config, *self.layers)

    @property
    def size(self) -> int:
        """Bytes of manifest, config and layers together."""
        return self.manifest.size + sum(d.size for d in self.blobs)

    @property
    def artifact_type(self) -> str:
        return str(self.document.get("artifactType") or self.config.media_type)


def _load_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        raise InputFileError(
            path.parent, f"is not an OCI image layout (no {path.name})", hint=f"{what}"
        ) from None
    except (OSError, ValueError) as exc:
        raise InputFileError(path, f"cannot be read as JSON: {exc}") from exc


def open_layout(root: Path, tag: str | None = None) -> LayoutImage:
    """The image of ``root`` named ``tag`` (its ``org.opencontainers.image.ref.name``), or the
    layout's only image."""
    root = Path(root)
    hint = "give the folder of an OCI image layout (with oci-layout, index.json and blobs/)"
    _load_json(root / "oci-layout", hint)
    index = _load_json(root / "index.json", hint)
    # an OCI 1.1 referrer (the image's SBOM) is listed with its artifactType: it is not an image
    listed = [
        m for m in index.get("manifests", []) if not (isinstance(m, dict) and "artifactType" in m)
    ]
    entries = [Descriptor.from_json(m, root / "index.json") for m in listed]
    if tag is not None:
        entries = [m for m in entries if m.annotations.get(REF_NAME) == tag]
    if len(entries) != 1:
        names = sorted(
            m.annotations.get(REF_NAME, m.digest)
            for m in (Descriptor.from_json(x, root) for x in index.get("manifests", []))
        )
        which = f"no image tagged {tag!r}" if tag and not entries else f"{len(entries)} images"
        raise InputFileError(
            root / "index.json",
            f"has {which} (found: {', '.join(names) or 'none'})",
            hint="name one image as DIR:TAG",
        )
    desc = entries[0]
    if desc.media_type not in (OCI_MANIFEST, DOCKER_MANIFEST):
        raise InputFileError(
            root / "index.json", f"points at a {desc.media_type or 'untyped'} document",
            hint="envbuild pushes single-platform image manifests",
        )  # fmt: skip
    path = root / "blobs" / desc.digest.replace(":", "/", 1)
    raw = _read_blob(path, desc)
    document = json.loads(raw)
    where = path
    config = Descriptor.from_json(document.get("config"), where)
    layers = tuple(Descriptor.from_json(d, where) for d in document.get("layers", []))
    return LayoutImage(root, desc, document, config, layers)


def _read_blob(path: Path, desc: Descriptor) -> bytes:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise IntegrityError(f"{path}: blob {desc.digest} is missing from the layout") from None
    if len(raw) != desc.size or "sha256:" + sha256_bytes(raw) != desc.digest:
        raise IntegrityError(
            f"{path}: does not match its digest {desc.digest}",
            hint="the layout is corrupt: pull or build it again",
        )
    return raw


def verify_layout(image: LayoutImage) -> None:
    """Check the size and sha256 of every blob ``image`` references (IntegrityError if not)."""
    for desc in image.blobs:
        path = image.blob_path(desc)
        if not desc.digest.startswith("sha256:"):
            raise IntegrityError(f"{desc.digest}: only sha256 digests are supported")
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise IntegrityError(f"{path}: blob {desc.digest} is missing from the layout") from None
        if size != desc.size or "sha256:" + sha256_file(path) != desc.digest:
            raise IntegrityError(
                f"blob {desc.digest} does not match its digest ({path})",
                hint="the copy is corrupt: it was refused; fetch it again from a good source",
            )


def add_blob(root: Path, source: Path | bytes, media_type: str, **annotations: str) -> Descriptor:
    """Put ``source`` (a file, linked when it can be, or bytes) into ``root/blobs/sha256``."""
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    if isinstance(source, bytes):
        hexdigest = sha256_bytes(source)
        target = blobs / hexdigest
        if not target.exists():
            write_atomic(target, source)
        size = len(source)
    else:
        hexdigest = sha256_file(source)
        target = blobs / hexdigest
        if not target.exists():
            try:
                os.link(source, target)
            except OSError:
                shutil.copyfile(source, target)
        size = target.stat().st_size
    return Descriptor(media_type, f"sha256:{hexdigest}", size, dict(annotations))


def write_artifact(
    root: Path,
    *,
    artifact_type: str,
    config: bytes,
    layers: Sequence[Descriptor],
    annotations: dict[str, str],
    tag: str,
) -> Descriptor:
    """Write an OCI artifact manifest (config of type ``artifact_type``, ``layers`` already added
    with :func:`add_blob`) and an ``index.json`` naming it ``tag``. Returns the manifest's
    descriptor."""
    config_desc = add_blob(root, config, artifact_type)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": artifact_type,
        "config": config_desc.to_json(),
        "layers": [d.to_json() for d in layers],
        "annotations": dict(sorted(annotations.items())),
    }
    desc = add_blob(root, compact_json(manifest), OCI_MANIFEST)
    desc = Descriptor(OCI_MANIFEST, desc.digest, desc.size, {REF_NAME: tag})
    write_atomic(root / "oci-layout", compact_json({"imageLayoutVersion": "1.0.0"}))
    write_atomic(
        root / "index.json", compact_json({"schemaVersion": 2, "manifests": [desc.to_json()]})
    )
    return desc
