"""Blobs of an OCI layout read as their descriptors describe them; :func:`verify_layout`.

A blob is read through :func:`open_blob`, whatever reads it (a base imported into the store, a
push, a cache hit): its size is checked against its descriptor before a byte is read, no more than
that many bytes are ever read (a 2 GiB file under a 155-byte descriptor costs one ``fstat``), and
a layer's first bytes must be what its media type says (gzip, zstd or tar): ``zstd -d`` reads
gzip too, so a gzip layer listed as zstd would otherwise be imported and listed as zstd again.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from envbuild.errors import InputFileError
from envbuild.oci.layout import (
    _CHUNK,
    Descriptor,
    LayoutImage,
    _mismatch,
    _open_regular,
    _size_mismatch,
)


def verify_layout(image: LayoutImage) -> None:
    """Check the size, the sha256 and (for a layer) the format of every blob ``image``
    references, reading each once (:func:`open_blob`)."""
    for desc in image.blobs:
        path = image.blob_path(desc)
        with open_blob(path, desc, layout=image.root) as f:
            h = hashlib.sha256()
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        if f"sha256:{h.hexdigest()}" != desc.digest:
            raise _mismatch(path, desc.digest)


def layer_compression(media_type: str) -> str | None:
    """The compression a layer media type (OCI's or Docker's) names by its ending: ``"zstd"``,
    ``"gzip"`` or ``"none"`` (a plain tar); None for any other media type."""
    if media_type.endswith(("+zstd", ".zstd")):
        return "zstd"
    if media_type.endswith(("+gzip", ".gzip")):
        return "gzip"
    if media_type.endswith((".tar", "layer.v1.tar")):
        return "none"
    return None


#: How the bytes of each compression begin; a plain tar is told by its first header.
_MAGIC = {"gzip": b"\x1f\x8b", "zstd": b"\x28\xb5\x2f\xfd"}
_OTHER_MAGIC = {b"\xfd7zXZ\x00": "xz", b"BZh": "bzip2", b"PK\x03\x04": "zip"}
_BLOCK = 512


def _is_tar_header(head: bytes) -> bool:
    """Whether ``head`` begins with a tar header: ``ustar`` at 257 (POSIX and GNU), else a
    v7 header whose checksum is right, or the zero block of an empty archive."""
    block = head[:_BLOCK]
    if len(block) < _BLOCK:
        return False
    if block[257:262] == b"ustar" or block == bytes(_BLOCK):
        return True
    field = block[148:156].split(b"\0", 1)[0].strip()
    try:
        recorded = int(field or b"x", 8)
    except ValueError:
        return False
    return recorded == sum(block[:148]) + 8 * 0x20 + sum(block[156:])


def content_format(head: bytes) -> str:
    """What the first bytes of a blob are: ``"gzip"``, ``"zstd"``, ``"none"`` (a tar), or a
    word for anything else (``"xz"``, ``"zip"``, ``"empty"``, ``"unknown"``)."""
    for name, magic in _MAGIC.items():
        if head.startswith(magic):
            return name
    if _is_tar_header(head):
        return "none"
    if not head:
        return "empty"
    return next((n for m, n in _OTHER_MAGIC.items() if head.startswith(m)), "unknown")


_SAID = {"none": "an uncompressed tar", "gzip": "gzip", "zstd": "zstd", "empty": "empty"}


def check_layer_head(head: bytes, desc: Descriptor, where: Path) -> None:
    """Refuse a layer whose first bytes (``head``, :data:`_BLOCK` of them when it has that
    many) are not what its media type says (InputFileError naming the descriptor)."""
    want = layer_compression(desc.media_type)
    if want is None:
        return
    got = content_format(head)
    if got == want:
        return
    said = _SAID.get(got, f"{got} data" if got != "unknown" else "neither gzip, zstd nor a tar")
    raise InputFileError(
        where,
        f"is the layer {desc.digest} listed as {desc.media_type} ({_SAID[want]}), but its bytes "
        f"are {said}",
        hint="the image's manifest declares the wrong media type: fix or rebuild the image",
    )


class BlobStream:
    """A blob opened by :func:`open_blob`: reads stop at its descriptor's size, and a file that
    has more (or fewer) bytes than that is an IntegrityError when the reader gets there."""

    def __init__(self, f: IO[bytes], path: Path, desc: Descriptor, head: bytes) -> None:
        self._f, self._path, self._desc = f, path, desc
        self._head = head  # read already (to check the layer's format), handed out first
        self._left = desc.size - len(head)

    def read(self, n: int = -1) -> bytes:
        if self._head:
            data = self._head if n < 0 else self._head[:n]
            self._head = self._head[len(data) :]
            return data + self._read(-1) if n < 0 else data
        return self._read(n)

    def _read(self, n: int) -> bytes:
        if self._left <= 0:
            if self._f.read(1):  # it grew since it was opened: never read past its size
                raise _size_mismatch(self._path, self._desc, "more")
            return b""
        want = self._left if n < 0 else min(n, self._left)
        data = self._f.read(want)
        if not data:
            raise _size_mismatch(self._path, self._desc, "fewer")
        self._left -= len(data)
        return data

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> BlobStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def open_blob(path: Path, desc: Descriptor, *, layout: Path | None = None) -> Iterator[BlobStream]:
    """The blob ``desc`` at ``path`` (of the layout ``layout``, or a folder of blobs) opened for
    reading: a regular file (opened without blocking on a fifo), exactly ``desc.size`` bytes by
    its ``fstat`` before anything is read (else IntegrityError), a layer's first bytes what its
    media type says (else InputFileError), and never read past ``desc.size``. The caller hashes
    what it reads against the digest."""
    f = _open_regular(path, layout if layout is not None else path.parent, desc.digest)
    with f:
        actual = os.fstat(f.fileno()).st_size
        if actual != desc.size:
            raise _size_mismatch(path, desc, "more" if actual > desc.size else "fewer", actual)
        head = b""
        if layer_compression(desc.media_type) is not None:
            head = f.read(min(_BLOCK, desc.size))
            check_layer_head(head, desc, path)
        yield BlobStream(f, path, desc, head)
