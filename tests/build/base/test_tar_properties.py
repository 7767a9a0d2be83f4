"""Property tests of the base readers: generated archives (random member kinds, names with
``..``, absolute paths, symlink chains, hardlinks, sparse headers, long names, whiteouts, a small
bomb), in each compression, truncated anywhere. The invariant: a user error (exit 2) naming the
file, or a result holding only what is allowed; never another exception, never a write outside
the target, never an expansion past the limits."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.debianbase import need

from envbuild.build.base import rootfs
from envbuild.build.base.tarread import safe_extract
from envbuild.build.base.tarsafe import Limits, Tree
from envbuild.build.image import OciImageConfig, write_image
from envbuild.build.layers import Compression, Layer
from envbuild.build.ocilayout import write_oci_layout
from envbuild.errors import EnvbuildError, ExitCode, UserError
from envbuild.lock.model import OciLayoutBaseLock, RootfsBaseLock
from envbuild.oci.compression import open_uncompressed
from envbuild.oci.layout import OCI_MANIFEST
from envbuild.store.core import Store

from .tarcheck import (
    COMPRESSIONS,
    check_extracted,
    check_layer,
    compress,
    layer_members,
    listing,
    sha256,
)

PROPS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
LIMITS = Limits(max_bytes=1 << 20, max_members=200)
BOMB = bytes(2 << 20)  # past LIMITS.max_bytes

components = st.sampled_from(["a", "b", "dev", "..", ".", "", "d d", "é", "L" * 120, ".wh.a"])
relative = st.lists(components, min_size=1, max_size=4).map("/".join)
names = st.one_of(relative, relative.map(lambda n: "/" + n), st.just(".wh..wh..opq"))
KINDS = ["file", "dir", "symlink", "hardlink", "chr", "fifo", "gnu-sparse", "pax-sparse", "bomb"]


@st.composite
def members(draw: st.DrawFn) -> tuple[tarfile.TarInfo, bytes]:
    kind = draw(st.sampled_from(KINDS))
    info = tarfile.TarInfo(draw(names))
    data = b""
    info.mode = draw(st.sampled_from([0o644, 0o755, 0o4755, 0o777]))
    if kind in ("file", "bomb", "pax-sparse"):
        data = BOMB if kind == "bomb" else draw(st.binary(max_size=40))
        info.type = tarfile.REGTYPE
        if kind == "pax-sparse":
            info.pax_headers = {
                "GNU.sparse.major": "1",
                "GNU.sparse.minor": "0",
                "GNU.sparse.name": info.name,
                "GNU.sparse.realsize": str(1 << 32),
            }
    elif kind == "gnu-sparse":
        info.type = tarfile.GNUTYPE_SPARSE
    elif kind == "dir":
        info.type = tarfile.DIRTYPE
    elif kind in ("symlink", "hardlink"):
        info.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
        info.linkname = draw(st.one_of(names, st.sampled_from(["/", "/etc", "../../..", "a/.."])))
    elif kind == "chr":
        info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
    else:
        info.type = tarfile.FIFOTYPE
    info.size = len(data)
    return info, data


archives = st.lists(members(), max_size=10)


def tar_bytes(items: list[tuple[tarfile.TarInfo, bytes]], fmt: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for info, data in items:
            tf.addfile(info, io.BytesIO(data) if data else None)
    return buf.getvalue()


def formats(items: list[tuple[tarfile.TarInfo, bytes]]) -> int:
    sparse = any(i.pax_headers for i, _ in items)
    return tarfile.PAX_FORMAT if sparse else tarfile.GNU_FORMAT


class Sandbox:
    """A fresh folder per example: the input, a store, the target root and a canary outside."""

    def __init__(self, parent: Path) -> None:
        self.dir = Path(tempfile.mkdtemp(dir=parent))
        self.outside = self.dir / "outside"
        self.outside.mkdir()
        (self.outside / "secret").write_text("keep me")
        self.root = self.dir / "root"
        self.store = Store(self.dir / "store")

    def before(self) -> list[str]:
        return listing(self.dir, skip=("store", "root"))

    def check_nothing_outside(self, before: list[str]) -> None:
        assert listing(self.dir, skip=("store", "root")) == before
        assert (self.outside / "secret").read_text() == "keep me"
        assert listing(self.outside) == ["secret"]

    def close(self) -> None:
        shutil.rmtree(self.dir)


def refused(exc: UserError, name: str) -> None:
    assert exc.exit_code == ExitCode.USER_ERROR
    assert name in exc.message, exc.message


def read_rootfs(box: Sandbox, data: bytes, name: str) -> Any:
    path = box.dir / name
    pin = RootfsBaseLock(kind="rootfs", path=name, sha256=sha256(data))
    return rootfs.from_tarball(box.store, path, pin, compression=Compression.NONE, limits=LIMITS)


def check_rootfs(box: Sandbox, data: bytes, name: str) -> None:
    (box.dir / name).write_bytes(data)
    before = box.before()
    try:
        base = read_rootfs(box, data, name)
    except UserError as exc:
        refused(exc, name)
        box.check_nothing_outside(before)
        return
    (layer,) = base.layers
    blob = box.store.blob_path(layer.digest).read_bytes()
    assert len(blob) <= LIMITS.max_bytes + (64 << 10)  # headers of the re-packed layer
    check_layer(layer_members(blob))
    with open_uncompressed(box.store.blob_path(layer.digest), layer.media_type) as f:
        safe_extract(f, box.root, where=name)
    check_extracted(box.root)
    box.check_nothing_outside(before)


@pytest.mark.parametrize("how", COMPRESSIONS)
@PROPS
@given(items=archives, cut=st.one_of(st.none(), st.floats(min_value=0, max_value=1)))
def test_rootfs_reader(tmp_path: Path, how: str, items: list[Any], cut: float | None) -> None:
    if how == "zstd":
        need("zstd")
    data = compress(tar_bytes(items, formats(items)), how)
    if cut is not None:
        data = data[: int(len(data) * cut)]
    box = Sandbox(tmp_path)
    try:
        check_rootfs(box, data, f"base.tar.{how}")
    finally:
        box.close()


GOOD = [
    (tarfile.TarInfo("etc"), b""),
    (tarfile.TarInfo("etc/os-release"), b"ID=test\n" * 20),
    (tarfile.TarInfo("bin"), b""),
    (tarfile.TarInfo("bin/sh"), b""),
    (tarfile.TarInfo("usr/bin/sh"), b""),
]
GOOD[0][0].type = GOOD[2][0].type = tarfile.DIRTYPE
GOOD[1][0].size = len(GOOD[1][1])
GOOD[3][0].type, GOOD[3][0].linkname = tarfile.SYMTYPE, "../usr/bin/sh"
GOOD[4][0].type, GOOD[4][0].linkname = tarfile.LNKTYPE, "etc/os-release"


@pytest.mark.parametrize("how", COMPRESSIONS)
def test_truncation_at_every_offset(tmp_path: Path, how: str) -> None:
    """A small good archive cut at every offset (every 3rd byte compressed, every 29th of the
    plain tar, to stay fast on 2 cores): each cut is refused naming the file, or reads as a
    smaller archive of allowed members."""
    if how == "zstd":
        need("zstd")
    raw = tar_bytes(GOOD, tarfile.GNU_FORMAT).rstrip(b"\0")  # without the record's padding
    raw += bytes(-len(raw) % 512 + 1024)
    data = compress(raw, how)
    step = 29 if how == "none" else 3
    for cut in range(0, len(data), step):
        box = Sandbox(tmp_path)
        try:
            check_rootfs(box, data[:cut], f"cut.{how}")
        finally:
            box.close()
    box = Sandbox(tmp_path)
    check_rootfs(box, data, f"whole.{how}")
    box.close()


# --- OCI layouts ------------------------------------------------------------------------------


def layer_of(store: Store, raw: bytes, blob: bytes) -> Layer:
    digest = store.add_bytes(blob)
    return Layer(
        digest=digest,
        diff_id="sha256:" + sha256(raw),
        size=len(blob),
        media_type="application/vnd.oci.image.layer.v1.tar+gzip",
        compression=Compression.GZIP,
        compressor="test",
        uncompressed_size=len(raw),
        entries=0,
        files=0,
        file_bytes=0,
    )


@PROPS
@given(
    layers=st.lists(archives, min_size=1, max_size=3),
    cut=st.one_of(st.none(), st.floats(min_value=0, max_value=1)),
)
def test_oci_layout_reader(tmp_path: Path, layers: list[Any], cut: float | None) -> None:
    box = Sandbox(tmp_path)
    try:
        src = Store(box.dir / "src")
        made = []
        for i, items in enumerate(layers):
            raw = tar_bytes(items, formats(items))
            blob = gzip.compress(raw, mtime=0)
            if cut is not None and i == len(layers) - 1:
                blob = blob[: int(len(blob) * cut)]
            made.append(layer_of(src, raw, blob))
        image = write_image(src, layers=made, config=OciImageConfig())
        layout = write_oci_layout(src, image, box.dir / "layout", ref_name="t")
        pin = OciLayoutBaseLock(kind="oci-layout", path="layout", digest=image.manifest_digest)
        before = box.before()
        try:
            base = rootfs.from_oci_layout(box.store, layout, pin, limits=LIMITS)
        except UserError as exc:
            refused(exc, str(layout))
            box.check_nothing_outside(before)
            return
        tree = Tree("extract", LIMITS)
        for i, layer in enumerate(base.layers):
            if i:
                tree.next_layer()
            with open_uncompressed(box.store.blob_path(layer.digest), layer.media_type) as f:
                safe_extract(f, box.root, where=layer.digest, tree=tree)
        check_extracted(box.root)
        box.check_nothing_outside(before)
    finally:
        box.close()


# --- the JSON of an OCI layout ----------------------------------------------------------------

KEYS = ["layers", "config", "digest", "mediaType", "rootfs", "diff_ids", "history", "Env",
        "Cmd", "Labels", "created_by", "empty_layer", "architecture", "os"]  # fmt: skip
json_values = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(), st.text(max_size=8),
        st.sampled_from(["sha256:" + "0" * 64, "application/vnd.oci.image.layer.v1.tar+gzip"]),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=4)), inner, max_size=4),
    ),
    max_leaves=15,
)  # fmt: skip


@PROPS
@given(manifest=json_values, config=json_values, real=st.booleans())
def test_oci_layout_json_of_any_shape(
    tmp_path: Path, manifest: Any, config: Any, real: bool
) -> None:
    """A layout whose manifest and config are any JSON (or, with ``real``, a real layer put
    into them where they have room): an envbuild error, never another exception."""

    box = Sandbox(tmp_path)
    try:
        blobs = box.dir / "layout" / "blobs" / "sha256"
        blobs.mkdir(parents=True)

        def put(data: bytes, media_type: str) -> dict[str, Any]:
            (blobs / sha256(data)).write_bytes(data)
            return {"digest": "sha256:" + sha256(data), "size": len(data), "mediaType": media_type}

        raw = tar_bytes([(tarfile.TarInfo("a"), b"")], tarfile.GNU_FORMAT)
        layer = put(gzip.compress(raw, mtime=0), "application/vnd.oci.image.layer.v1.tar+gzip")
        if real and isinstance(config, dict):
            config["rootfs"] = {"diff_ids": ["sha256:" + sha256(raw)]}
        config_desc = put(json.dumps(config).encode(), "x")
        if real and isinstance(manifest, dict):
            manifest["config"] = config_desc
            manifest["layers"] = [layer]
        desc = put(json.dumps(manifest).encode(), OCI_MANIFEST)
        (box.dir / "layout" / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
        (box.dir / "layout" / "index.json").write_text(
            json.dumps({"schemaVersion": 2, "manifests": [desc]})
        )
        pin = OciLayoutBaseLock(kind="oci-layout", path="layout", digest=desc["digest"])
        with contextlib.suppress(EnvbuildError):
            rootfs.from_oci_layout(box.store, box.dir / "layout", pin, limits=LIMITS)
    finally:
        box.close()
