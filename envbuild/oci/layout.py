"""OCI image layouts read from disk: the media types, the descriptor, and the one layout reader.

A layout (image-spec ``image-layout.md``) is a folder holding ``oci-layout``, ``index.json`` and
``blobs/sha256/<hex>``. :func:`read_index` reads its index (the images it lists: an OCI 1.1
referrer such as an SBOM, listed with its ``artifactType``, is not one); :func:`select_manifest`
picks one entry (by digest, by ref name, or the only image); :func:`open_layout` follows it,
through an index to one platform when asked, to a :class:`LayoutImage`: the manifest's descriptor
and document and the descriptors of its config and layers. :meth:`LayoutImage.read_config`
reads the config. Reading a blob itself (a layer) is :mod:`envbuild.oci.blobs`'.

A layout is untrusted input, so reading is total and bounded. Each JSON document is read from a
regular file (a symlink is followed only to one; a fifo or device is refused without blocking),
at most :data:`MAX_DOCUMENT` bytes (:data:`MAX_CONFIG` for a config), and checked against its
descriptor's size and sha256 before it is parsed. A missing file, malformed JSON, a wrong shape
or media type, a digest that is not ``sha256:<64 hex>`` or a size past the bound is an
:class:`~envbuild.errors.InputFileError` (exit 2) naming the file; bytes that differ from the
size or digest they were listed under are an :class:`~envbuild.errors.IntegrityError` (exit 3:
the layout is damaged, as a download that does not match its digest is). Nothing else escapes.

"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

from envbuild.errors import InputFileError, IntegrityError

log = logging.getLogger(__name__)

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
#: The manifests a layout's image may be, and the indexes followed to one of them.
MANIFEST_TYPES = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
INDEX_TYPES = frozenset({OCI_INDEX, DOCKER_MANIFEST_LIST})

REF_NAME = "org.opencontainers.image.ref.name"
#: The full image name (``docker.io/envbuild/quickstart:latest``) that containerd's import and
#: podman's load name an image by, before ``REF_NAME`` (which ``docker save`` sets to the tag).
IMAGE_NAME = "io.containerd.image.name"
TITLE = "org.opencontainers.image.title"
#: The ``oci-layout`` file envbuild writes.
OCI_LAYOUT = b'{"imageLayoutVersion":"1.0.0"}'


class Compression(StrEnum):
    """How a layer's tar is compressed (its media type says which)."""

    ZSTD = "zstd"
    GZIP = "gzip"
    NONE = "none"


#: Layer compression unless asked otherwise: zstd packs several times faster than gzip; gzip is
#: read by every tool (umoci 0.4, Docker before 23).
COMPRESSION = Compression.ZSTD

DIGEST_RE = re.compile(r"^sha256:([0-9a-f]{64})\Z")
#: The most bytes ``index.json``, ``oci-layout``, a manifest or an index may have (what
#: registries accept for a manifest).
MAX_DOCUMENT = 4 << 20
#: The most bytes an image config may have (its history grows with the layers).
MAX_CONFIG = 16 << 20
#: How many indexes deep a layout's image may be.
MAX_DEPTH = 4
_CHUNK = 1 << 20
_SHOWN = 200  # characters of a malformed value quoted in an error


@dataclass(frozen=True)
class Platform:
    """The platform an index entry is for."""

    os: str
    architecture: str
    variant: str = ""

    def to_json(self) -> dict[str, str]:
        out = {"architecture": self.architecture, "os": self.os}
        if self.variant:
            out["variant"] = self.variant
        return out


@dataclass(frozen=True)
class Descriptor:
    """A reference to a blob: its media type, ``sha256:`` digest and size, and what the listing
    says about it (annotations; in an index, its artifact type and platform)."""

    media_type: str
    digest: str
    size: int
    annotations: dict[str, str] = field(default_factory=dict)
    artifact_type: str | None = None
    platform: Platform | None = None

    @classmethod
    def from_json(cls, data: Any, where: Path) -> Descriptor:
        """The descriptor ``data`` (JSON read from ``where``); InputFileError unless it has a
        string media type (may be missing: then ""), a sha256 digest and a size >= 0."""

        def bad(why: str) -> InputFileError:
            return InputFileError(where, f"has a malformed descriptor ({why}): {_shown(data)}")

        if not isinstance(data, dict):
            raise bad("not a JSON object")
        media_type = data.get("mediaType", "")
        digest, size = data.get("digest"), data.get("size")
        if not isinstance(media_type, str):
            raise bad("mediaType is not a string")
        if not isinstance(digest, str) or not DIGEST_RE.match(digest):
            raise bad("digest is not sha256:<64 hex>")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise bad("size is not a whole number")
        annotations = data.get("annotations") or {}
        if not isinstance(annotations, dict) or not all(
            isinstance(v, str) for v in annotations.values()
        ):
            raise bad("annotations are not strings")
        artifact_type = data.get("artifactType")
        if artifact_type is not None and not isinstance(artifact_type, str):
            raise bad("artifactType is not a string")
        platform = None
        if data.get("platform") is not None:
            p = data["platform"]
            if not isinstance(p, dict) or not all(
                isinstance(p.get(k, ""), str) for k in ("os", "architecture", "variant")
            ):
                raise bad("platform is not os and architecture strings")
            platform = Platform(p.get("os", ""), p.get("architecture", ""), p.get("variant", ""))
        return cls(media_type, digest, size, dict(annotations), artifact_type, platform)

    def to_json(self) -> dict[str, Any]:
        """The descriptor as JSON (annotations sorted)."""
        out: dict[str, Any] = {
            "mediaType": self.media_type,
            "digest": self.digest,
            "size": self.size,
        }
        if self.annotations:
            out["annotations"] = dict(sorted(self.annotations.items()))
        if self.artifact_type is not None:
            out["artifactType"] = self.artifact_type
        if self.platform is not None:
            out["platform"] = self.platform.to_json()
        return out

    @property
    def hex(self) -> str:
        """The digest's hex part: the blob's file name."""
        return self.digest.split(":", 1)[1]


@dataclass(frozen=True)
class Index:
    """A layout's ``index.json``: every entry, in order."""

    root: Path
    manifests: tuple[Descriptor, ...]

    @property
    def images(self) -> tuple[Descriptor, ...]:
        """The entries that are images: an OCI 1.1 referrer (the image's SBOM) is listed with
        its ``artifactType``."""
        return tuple(d for d in self.manifests if d.artifact_type is None)


@dataclass(frozen=True)
class LayoutImage:
    """One image (or artifact) manifest of an OCI layout, with its config and layers."""

    root: Path
    manifest: Descriptor
    document: dict[str, Any]
    config: Descriptor
    layers: tuple[Descriptor, ...]

    def blob_path(self, blob: Descriptor | str) -> Path:
        """The file of a blob (a descriptor or a digest, checked before it names a path)."""
        digest = blob.digest if isinstance(blob, Descriptor) else blob
        m = DIGEST_RE.match(digest)
        if not m:
            raise InputFileError(self.root, f"names a blob by {_shown(digest)}, not a sha256")
        return self.root / "blobs" / "sha256" / m.group(1)

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
        """The manifest's ``artifactType``, else its config's media type."""
        return str(self.document.get("artifactType") or self.config.media_type)

    def read_config(self) -> dict[str, Any]:
        """The config document (a JSON object), checked against its descriptor."""
        return _read_json_blob(self.root, self.config.digest, self.config.size, MAX_CONFIG)


def read_index(root: Path) -> Index:
    """The ``index.json`` of the layout at ``root`` (whose ``oci-layout`` must be JSON)."""
    root = Path(root)
    _parse(root / "oci-layout", _read_file(root / "oci-layout", MAX_DOCUMENT, layout=root))
    path = root / "index.json"
    doc = _object(path, _parse(path, _read_file(path, MAX_DOCUMENT, layout=root)))
    listed = doc.get("manifests")
    if listed is None:
        listed = []
    if not isinstance(listed, list):
        raise InputFileError(path, f"has manifests that are not a list: {_shown(listed)}")
    return Index(root, tuple(Descriptor.from_json(m, path) for m in listed))


def select_manifest(root: Path, *, tag: str | None = None, digest: str | None = None) -> Descriptor:
    """The entry of ``root``'s index named by ``digest`` (any entry; one the index does not list
    is looked up in ``blobs/``), else the image named ``tag`` (its ref name), else the only
    image."""
    index = read_index(root)
    if digest is not None:
        if not DIGEST_RE.match(digest):
            raise InputFileError(root, f"cannot hold {_shown(digest)}: not a sha256 digest")
        for desc in index.manifests:
            if desc.digest == digest:
                return desc
        return _unlisted(root, digest)
    entries = index.images
    if tag is not None:
        entries = tuple(d for d in entries if d.annotations.get(REF_NAME) == tag)
    if len(entries) == 1:
        return entries[0]
    names = sorted(d.annotations.get(REF_NAME, d.digest) for d in index.images)
    which = f"no image tagged {tag!r}" if tag and not entries else f"{len(entries)} images"
    raise InputFileError(
        root / "index.json",
        f"has {which} (found: {', '.join(names) or 'none'})",
        hint="name one image by its tag (org.opencontainers.image.ref.name) or its digest",
    )


def open_layout(
    root: Path,
    tag: str | None = None,
    *,
    digest: str | None = None,
    architecture: str | None = None,
) -> LayoutImage:
    """The image of the layout at ``root`` that :func:`select_manifest` picks. An index (OCI
    or Docker) is followed to its first ``linux/architecture`` entry when ``architecture`` is
    given, and refused when not."""
    root = Path(root)
    desc = select_manifest(root, tag=tag, digest=digest)
    listed_in = root / "index.json"
    for _ in range(MAX_DEPTH):
        if desc.media_type not in MANIFEST_TYPES | INDEX_TYPES:
            raise InputFileError(
                listed_in,
                f"points at a {_shown(desc.media_type) if desc.media_type else 'untyped'} "
                "document, not an image manifest",
                hint="give a layout of a single-platform image manifest",
            )
        where = root / "blobs" / "sha256" / desc.hex
        doc = _read_json_blob(root, desc.digest, desc.size, MAX_DOCUMENT)
        own = doc.get("mediaType")
        if own is not None and own != desc.media_type:
            raise InputFileError(where, f"is a {_shown(own)} listed as a {desc.media_type}")
        if desc.media_type in MANIFEST_TYPES:
            return _image(root, desc, doc, where)
        if architecture is None:
            raise InputFileError(
                where,
                "is an index of images, not an image manifest",
                hint="give a layout of a single-platform image manifest",
            )
        desc, listed_in = _platform_entry(doc, where, architecture), where
    raise InputFileError(root, f"has indexes nested more than {MAX_DEPTH} deep")


def _image(root: Path, desc: Descriptor, doc: dict[str, Any], where: Path) -> LayoutImage:
    if not isinstance(doc.get("config"), dict):
        raise InputFileError(where, "is an image manifest without a config descriptor")
    config = Descriptor.from_json(doc["config"], where)
    listed = doc.get("layers")
    if listed is None:
        listed = []
    if not isinstance(listed, list):
        raise InputFileError(where, f"has layers that are not a list: {_shown(listed)}")
    layers = tuple(Descriptor.from_json(d, where) for d in listed)
    return LayoutImage(root, desc, doc, config, layers)


def _platform_entry(doc: dict[str, Any], where: Path, architecture: str) -> Descriptor:
    listed = doc.get("manifests")
    if not isinstance(listed, list):
        raise InputFileError(where, f"is an index whose manifests are not a list: {_shown(listed)}")
    for entry in (Descriptor.from_json(m, where) for m in listed):
        p = entry.platform
        if p is not None and p.os == "linux" and p.architecture == architecture:
            return entry
    raise InputFileError(where, f"is an index without a linux/{architecture} image")


def _unlisted(root: Path, digest: str) -> Descriptor:
    """A descriptor for blob ``digest`` that the index does not list: its size from the file,
    its media type from the document (an index when it has ``manifests``)."""
    where = root / "blobs" / "sha256" / digest[7:]
    data = _read_blob(root, digest, None, MAX_DOCUMENT)
    doc = _object(where, _parse(where, data))
    own = doc.get("mediaType", OCI_INDEX if "manifests" in doc else OCI_MANIFEST)
    if not isinstance(own, str):
        raise InputFileError(where, f"has a mediaType that is not a string: {_shown(own)}")
    return Descriptor(own, digest, len(data))


def _read_json_blob(root: Path, digest: str, size: int, limit: int) -> dict[str, Any]:
    where = root / "blobs" / "sha256" / digest[7:]
    return _object(where, _parse(where, _read_blob(root, digest, size, limit)))


def _read_blob(root: Path, digest: str, size: int | None, limit: int) -> bytes:
    """The bytes of blob ``digest`` of the layout ``root``: ``size`` of them when known, at
    most ``limit``, hashing to ``digest``."""
    path = root / "blobs" / "sha256" / digest[7:]
    if size is not None and size > limit:
        raise InputFileError(
            path, f"is listed as {size} bytes, more than the {limit} a JSON document may have"
        )
    data = _read_file(path, limit, layout=root, size=size, digest=digest)
    if f"sha256:{hashlib.sha256(data).hexdigest()}" != digest:
        raise _mismatch(path, digest)
    return data


def _read_file(
    path: Path, limit: int, *, layout: Path, size: int | None = None, digest: str = ""
) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit``; exactly ``size`` when given
    (else IntegrityError: blob ``digest`` was listed with another size)."""
    with _open_regular(path, layout) as f:
        actual = os.fstat(f.fileno()).st_size
        if size is not None and actual != size:
            raise _mismatch(path, digest)
        if actual > limit:
            raise InputFileError(path, f"is {actual} bytes, more than the {limit} it may have")
        data = f.read(limit + 1)
    if size is not None and len(data) != size:
        raise _mismatch(path, digest)  # it changed while it was read
    if len(data) > limit:
        raise InputFileError(path, f"grew past the {limit} bytes it may have while it was read")
    return data


def _open_regular(path: Path, layout: Path, digest: str = "") -> IO[bytes]:
    """``path`` opened for reading, refused (without blocking on a fifo) unless it is a regular
    file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise _missing(path, layout, digest) from None
    except OSError as exc:
        raise InputFileError(path, f"cannot be read: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputFileError(path, "is not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _missing(path: Path, layout: Path, digest: str = "") -> InputFileError:
    if digest and path.parent == layout:  # a folder of blobs (skopeo's dir:)
        return InputFileError(
            layout, f"is incomplete: blob {digest} is missing", hint="pull it again"
        )
    if path.parent == layout:
        return InputFileError(
            layout,
            f"is not an OCI image layout (no {path.name})",
            hint="give the folder of an OCI image layout (with oci-layout, index.json and blobs/)",
        )
    return InputFileError(
        layout,
        f"is incomplete: blob sha256:{path.name} is missing",
        hint="write or pull the layout again",
    )


def _size_mismatch(
    path: Path, desc: Descriptor, which: str, actual: int | None = None
) -> IntegrityError:
    has = f"is {actual} bytes" if actual is not None else f"has {which} bytes"
    return IntegrityError(
        f"{path}: does not match its digest {desc.digest}: it {has}, its descriptor says "
        f"{desc.size}",
        hint="the layout is corrupt, or its manifest lists a wrong size: pull or build it again",
    )


def _mismatch(path: Path, digest: str) -> IntegrityError:
    return IntegrityError(
        f"{path}: does not match its digest {digest}",
        hint="the layout is corrupt: pull or build it again",
    )


def _parse(path: Path, data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise InputFileError(path, f"cannot be read as JSON: {_shown(str(exc))}") from None


def _object(path: Path, doc: Any) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise InputFileError(path, f"is not a JSON object: {_shown(doc)}")
    return doc


def _shown(value: Any) -> str:
    try:
        text = repr(value)
    except RecursionError:
        return "(a value nested too deep to show)"
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"
