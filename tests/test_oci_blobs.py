"""A layer blob is read only as its descriptor describes it: its size checked before any byte is
read and never read past, its first bytes what its media type says (gzip, zstd or a tar).

These were found on the landed main: a gzip layer listed as zstd was imported (``zstd -d`` reads
gzip) and listed as zstd again; a layer listed with size 1 or 10^15 was imported all the same;
a 155-byte descriptor over a 2 GiB sparse file copied 2 GiB into the store before it failed.
Each case goes through the real readers: an OCI layout base imported into a real store
(:func:`envbuild.build.base.rootfs.from_oci_layout`) and the check a push makes
(:func:`envbuild.oci.core.verify_layout`).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from support.treelayer import layer_from_tree

from envbuild.build.base import rootfs
from envbuild.build.image import History, OciImageConfig, write_image
from envbuild.build.layers import Compression
from envbuild.build.ocilayout import write_oci_layout
from envbuild.errors import InputFileError, IntegrityError
from envbuild.lock.model import OciLayoutBaseLock
from envbuild.oci import core as oci
from envbuild.store.core import Store

GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
TAR = "application/vnd.oci.image.layer.v1.tar"
TYPES = {Compression.GZIP: GZIP, Compression.ZSTD: ZSTD, Compression.NONE: TAR}


def layout_of(tmp_path: Path, compression: Compression) -> tuple[Path, str]:
    """A one-layer OCI layout (``compression``) and its manifest digest."""
    store = Store(tmp_path / "src")
    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True, exist_ok=True)
    (tree / "etc" / "os-release").write_text("ID=test\n" * 50)
    layer = layer_from_tree(store, tree, compression=compression)
    image = write_image(
        store, layers=[layer], config=OciImageConfig(), history=[History(created_by="t")]
    )
    layout = write_oci_layout(store, image, tmp_path / "layout", ref_name="base")
    return layout, image.manifest_digest


def relist(layout: Path, digest: str, **layer: Any) -> str:
    """List the layout's image again with its layer's descriptor changed by ``layer``; returns
    the new manifest's digest (the one index.json now lists)."""
    blobs = layout / "blobs" / "sha256"
    doc = json.loads((blobs / digest.split(":")[1]).read_bytes())
    doc["layers"][0].update(layer)
    data = json.dumps(doc).encode()
    new = hashlib.sha256(data).hexdigest()
    (blobs / new).write_bytes(data)
    index = json.loads((layout / "index.json").read_bytes())
    index["manifests"][0].update({"digest": f"sha256:{new}", "size": len(data)})
    (layout / "index.json").write_text(json.dumps(index))
    return f"sha256:{new}"


def imported(tmp_path: Path, layout: Path, digest: str) -> Any:
    pin = OciLayoutBaseLock(kind="oci-layout", path="layout", digest=digest)
    return rootfs.from_oci_layout(Store(tmp_path / "store"), layout, pin)


@pytest.mark.parametrize(
    ("made", "listed"),
    [
        (Compression.GZIP, ZSTD),  # the case found: zstd -d reads gzip
        (Compression.ZSTD, GZIP),
        (Compression.NONE, GZIP),
        (Compression.GZIP, TAR),
        (Compression.ZSTD, "application/vnd.docker.image.rootfs.diff.tar.gzip"),
    ],
)
def test_a_layer_whose_bytes_are_not_its_media_type_is_refused(
    tmp_path: Path, made: Compression, listed: str
) -> None:
    layout, digest = layout_of(tmp_path, made)
    digest = relist(layout, digest, mediaType=listed)
    with pytest.raises(InputFileError) as refused:
        imported(tmp_path, layout, digest)
    assert refused.value.exit_code == 2
    said = str(refused.value)
    layer = json.loads((layout / "blobs" / "sha256" / digest[7:]).read_bytes())["layers"][0]
    assert layer["digest"] in said and listed in said, said  # it names the descriptor
    with pytest.raises(InputFileError):  # a push checks the same, in the same reader
        oci.verify_layout(oci.open_layout(layout, digest=digest))


@pytest.mark.parametrize("compression", list(Compression))
def test_a_layer_that_is_what_it_says_is_imported(tmp_path: Path, compression: Compression) -> None:
    layout, digest = layout_of(tmp_path, compression)
    base = imported(tmp_path, layout, digest)
    assert [x.media_type for x in base.layers] == [TYPES[compression]]
    oci.verify_layout(oci.open_layout(layout, digest=digest))


@pytest.mark.parametrize("size", [1, 10**15])
def test_a_layer_listed_with_another_size_is_refused(tmp_path: Path, size: int) -> None:
    layout, digest = layout_of(tmp_path, Compression.ZSTD)
    digest = relist(layout, digest, size=size)
    with pytest.raises(IntegrityError, match=f"its descriptor says {size}"):
        imported(tmp_path, layout, digest)
    with pytest.raises(IntegrityError, match=f"its descriptor says {size}"):
        oci.verify_layout(oci.open_layout(layout, digest=digest))


def test_a_huge_blob_under_a_small_descriptor_is_refused_before_it_is_read(
    tmp_path: Path,
) -> None:
    """155 bytes listed, a 2 GiB sparse file there: refused at once, nothing copied."""
    layout, digest = layout_of(tmp_path, Compression.GZIP)
    blobs = layout / "blobs" / "sha256"
    layer = json.loads((blobs / digest[7:]).read_bytes())["layers"][0]
    path = blobs / layer["digest"][7:]
    data = path.read_bytes()
    path.unlink()  # a hard link to the source store's blob: write a new file
    with path.open("wb") as f:
        f.write(data)
        f.truncate(2 << 30)
    digest = relist(layout, digest, size=155)
    store = tmp_path / "store" / "tmp"
    start = time.monotonic()
    with pytest.raises(IntegrityError, match="it is 2147483648 bytes, its descriptor says 155"):
        imported(tmp_path, layout, digest)
    assert time.monotonic() - start < 10
    assert sum(p.stat().st_size for p in store.rglob("*") if p.is_file()) < 1 << 20
    with pytest.raises(IntegrityError, match="its descriptor says 155"):
        oci.verify_layout(oci.open_layout(layout, digest=digest))


def test_a_blob_that_grows_while_it_is_read_is_never_read_past_its_size(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    path.write_bytes(b"\x1f\x8b" + bytes(998))
    desc = oci.Descriptor(GZIP, "sha256:" + "0" * 64, 1000)
    with oci.open_blob(path, desc) as f:
        first = f.read(600)
        with path.open("ab") as more:
            more.write(b"x" * (1 << 20))
        assert len(first + f.read()) == 1000  # what the descriptor says, no more
        with pytest.raises(IntegrityError, match="has more bytes"):
            f.read()


def test_a_fifo_in_a_layout_is_refused_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    os.mkfifo(path)
    desc = oci.Descriptor(GZIP, "sha256:" + "0" * 64, 10)
    with pytest.raises(InputFileError, match="is not a regular file"), oci.open_blob(path, desc):
        pass


@pytest.mark.parametrize(
    ("head", "what"),
    [
        (b"\x1f\x8b\x08", "gzip"),
        (b"\x28\xb5\x2f\xfd", "zstd"),
        (b"\xfd7zXZ\x00", "xz"),
        (b"PK\x03\x04", "zip"),
        (b"", "empty"),
        (bytes(512), "none"),  # an empty tar
        (b"garbage" * 100, "unknown"),
    ],
)
def test_content_format(head: bytes, what: str) -> None:
    assert oci.content_format(head) == what


def test_a_v7_tar_header_is_a_tar(tmp_path: Path) -> None:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        tf.addfile(tarfile.TarInfo("a"), io.BytesIO(b""))
    block = bytearray(buf.getvalue()[:512])
    block[257:265] = bytes(8)  # no ustar magic: a v7 header, its checksum made right again
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    assert oci.content_format(bytes(block)) == "none"
    block[0] ^= 1  # a wrong checksum: not a tar
    assert oci.content_format(bytes(block)) == "unknown"
