"""The ``docker load`` archive of an image: an OCI layout plus Docker's ``manifest.json`` in one
deterministic tar (:mod:`envbuild.build.tarwrite`), its blobs streamed from the store.

Docker before 23 cannot read zstd layers (``archive/tar: invalid tar header``, checked with 20.10),
so when the image has zstd layers the archive holds them uncompressed (their digest is then their
diff_id; the config, hence Docker's image ID, is the same), decompressed on the fly. Every blob is
checked before it is read and hashed as it is read: a corrupt store blob never reaches the tar.

The archive is also an OCI layout, and podman and ``ctr images import`` read it as one: its
``index.json`` lists the image once per tag with the annotations ``docker save`` writes
(``io.containerd.image.name`` the full name, ``org.opencontainers.image.ref.name`` the tag);
without them podman loads it untagged and containerd imports nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from envbuild.build import tarwrite
from envbuild.build.entries import Entry, Kind, Opener, arrange
from envbuild.build.image import Image, blob_role, manifest_json
from envbuild.build.layers import Compression
from envbuild.errors import ToolFailed
from envbuild.fsio import atomic_writer, compact_json
from envbuild.oci.compression import MEDIA_TYPES, open_uncompressed
from envbuild.oci.layout import IMAGE_NAME, OCI_INDEX, OCI_LAYOUT, REF_NAME
from envbuild.store.blobs import digest_hex
from envbuild.store.core import Store

log = logging.getLogger(__name__)

#: The archive's name in a build's output folder.
DOCKER_ARCHIVE = "docker-archive.tar"


def uncompressed_variant(store: Store, image: Image) -> Image:
    """The same image (same config, same image ID) with every layer uncompressed."""
    plain = [
        x.model_copy(
            update={
                "digest": x.diff_id,
                "size": x.uncompressed_size,
                "media_type": MEDIA_TYPES[Compression.NONE],
                "compression": Compression.NONE,
                "compressor": "none",
            }
        )
        for x in image.layers
    ]
    man = manifest_json(image.config_digest, image.config_size, plain)
    return image.model_copy(
        update={"manifest_digest": store.add_bytes(man), "manifest_size": len(man), "layers": plain}
    )


class _Closing:
    """A readable stream whose close also ends the context that opened it."""

    def __init__(self, f: IO[bytes], stack: contextlib.ExitStack) -> None:
        self._f, self._stack = f, stack

    def readinto(self, buf: memoryview) -> int:
        return self._f.readinto(buf)  # type: ignore[attr-defined, no-any-return]

    def read(self, n: int = -1) -> bytes:
        return self._f.read(n)

    def __enter__(self) -> _Closing:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()


def _bytes_opener(data: bytes) -> Opener:
    return lambda: io.BytesIO(data)


class _Hashing:
    """A blob's stream that hashes what is read; at its end (``__exit__``) the digest must be
    ``digest``, else :class:`IntegrityError` names the store blob ``origin`` and the fix."""

    def __init__(self, f: Any, digest: str, origin: str, store: Store) -> None:
        self._f, self._digest, self._origin, self._store = f, digest, origin, store
        self._hash = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data: bytes = self._f.read(n)
        self._hash.update(data)
        return data

    def __enter__(self) -> _Hashing:
        return self

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        try:
            self._f.__exit__(kind, exc, tb)
        except ToolFailed as failed:  # a decompressor that cannot read the blob
            raise self._store.corrupt_error(
                self._origin, f"{failed.tool}: {failed.message}"
            ) from None
        if kind is None and f"sha256:{self._hash.hexdigest()}" != self._digest:
            raise self._store.corrupt_error(self._origin)


def _hashing_opener(
    store: Store, origin: str, digest: str, media_type: str | None = None
) -> Opener:
    """The bytes of store blob ``origin`` (uncompressed when ``media_type`` is given), checked
    against ``digest`` as the archive reads them."""
    path = store.blob_path(origin)

    def opener() -> IO[bytes]:
        if media_type is None:
            return _Hashing(path.open("rb"), digest, origin, store)  # type: ignore[return-value]
        stack = contextlib.ExitStack()
        f = stack.enter_context(open_uncompressed(path, media_type))
        return _Hashing(_Closing(f, stack), digest, origin, store)  # type: ignore[return-value]

    return opener


def full_name(tag: str) -> str:
    """Docker's full name for ``tag``: ``envbuild/x:1`` is ``docker.io/envbuild/x:1``, ``x`` is
    ``docker.io/library/x:latest`` (what the engine normalises a name in ``RepoTags`` to)."""
    first, slash, _ = tag.partition("/")
    if not slash or not ("." in first or ":" in first or first == "localhost"):
        tag = f"docker.io/{tag if slash else 'library/' + tag}"
    if ":" not in tag.rsplit("/", 1)[-1]:
        tag += ":latest"
    return tag


def archive_index(image: Image, repo_tags: Sequence[str]) -> bytes:
    """The archive's ``index.json``: the image once per tag, named as ``docker save`` names it."""
    manifests = []
    for name in map(full_name, repo_tags):
        desc = image.descriptor()
        desc["annotations"] = {IMAGE_NAME: name, REF_NAME: name.rsplit(":", 1)[1]}
        manifests.append(desc)
    return compact_json(
        {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests or [image.descriptor()]}
    )


def write_docker_archive(
    store: Store,
    image: Image,
    out_path: Path,
    *,
    repo_tags: Sequence[str],
    uncompressed: bool | None = None,
    mtime: int = 0,
) -> Image:
    """Write a tar that ``docker load`` accepts: an OCI layout plus Docker's ``manifest.json``.

    ``uncompressed`` (default: when any layer is zstd) stores the layers uncompressed so that
    Docker before 23 can load them. Returns the image as the archive holds it.
    """
    if uncompressed is None:
        uncompressed = any(x.compression is Compression.ZSTD for x in image.layers)
    inside = uncompressed_variant(store, image) if uncompressed else image
    entries: list[Entry] = []

    def add_bytes(name: str, data: bytes) -> None:
        entries.append(Entry(name, Kind.FILE, 0o644, size=len(data), source=_bytes_opener(data)))

    # a corrupt blob is refused before it is read (a damaged zstd stream would otherwise read
    # as a decompressor failure); what is read is hashed on the way all the same
    for digest in (inside.manifest_digest, inside.config_digest):
        path = store.verified_path(digest, what=blob_role(inside, digest))
        entries.append(
            Entry(
                f"blobs/sha256/{digest_hex(digest)}",
                Kind.FILE,
                0o644,
                size=path.stat().st_size,
                source=_hashing_opener(store, digest, digest),
            )
        )
    for orig, layer in zip(image.layers, inside.layers, strict=True):
        name = f"blobs/sha256/{digest_hex(layer.digest)}"
        if any(e.path == name for e in entries):
            continue
        store.verified_path(orig.digest, what="a layer")
        plain = layer.digest != orig.digest
        source = _hashing_opener(
            store, orig.digest, layer.digest, orig.media_type if plain else None
        )
        entries.append(Entry(name, Kind.FILE, 0o644, size=layer.size, source=source))
    docker_manifest = [
        {
            "Config": f"blobs/sha256/{digest_hex(inside.config_digest)}",
            "RepoTags": list(repo_tags),
            "Layers": [f"blobs/sha256/{digest_hex(x.digest)}" for x in inside.layers],
        }
    ]
    add_bytes("manifest.json", compact_json(docker_manifest))
    add_bytes("oci-layout", OCI_LAYOUT)
    add_bytes("index.json", archive_index(inside, repo_tags))
    arranged = arrange(entries)
    with atomic_writer(Path(out_path), 0o644) as f:

        def out(data: bytes | bytearray | memoryview) -> None:
            f.write(data)

        sink = tarwrite.Sink(out)
        tarwrite.write_tar(arranged, sink, mtime)
    return inside
