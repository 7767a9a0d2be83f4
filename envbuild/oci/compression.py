"""Layer compression: the media type each :class:`~envbuild.oci.core.Compression` is written as, the
compression a layer media type (OCI or Docker) names, and a layer blob's uncompressed tar stream.
Below the build, the registry and linkcheck, which all read layers."""

from __future__ import annotations

import contextlib
import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from envbuild.errors import UserError
from envbuild.oci.blobs import layer_compression
from envbuild.oci.layout import Compression
from envbuild.proc import core as proc

ZSTD_HINT = "install it (Debian: apt-get install zstd)"


MEDIA_TYPES = {
    Compression.ZSTD: "application/vnd.oci.image.layer.v1.tar+zstd",
    Compression.GZIP: "application/vnd.oci.image.layer.v1.tar+gzip",
    Compression.NONE: "application/vnd.oci.image.layer.v1.tar",
}


def compression_of(media_type: str) -> Compression:
    """The compression a layer media type (OCI or Docker) names (one definition:
    :func:`envbuild.oci.blobs.layer_compression`)."""
    named = layer_compression(media_type)
    if named is None:
        raise UserError(f"unsupported layer media type {media_type!r}")
    return Compression(named)


@contextlib.contextmanager
def open_uncompressed(path: Path, media_type: str) -> Iterator[IO[bytes]]:
    """The uncompressed tar stream of a layer blob, read sequentially."""
    compression = compression_of(media_type)
    if compression is Compression.ZSTD:
        argv = ["zstd", "-d", "-c", "-q", "--no-progress", str(path)]
        with proc.reading(argv, tool="zstd", hint=ZSTD_HINT) as f:
            yield f
    elif compression is Compression.GZIP:
        with gzip.open(path, "rb") as g:
            yield g  # type: ignore[misc]
    else:
        with path.open("rb") as f:
            yield f
