"""Every base reader follows one set of rules (envbuild.build.base.tarsafe): found by hand first,
each
case here is a class the property tests (test_tar_properties.py) also generate."""

from __future__ import annotations

import gzip
import hashlib
import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from support.debianbase import need

from envbuild.build.base import rootfs
from envbuild.build.base.tarsafe import GIB, CorruptArchive, Limits
from envbuild.build.image import OciImageConfig, write_image
from envbuild.build.layers import Compression, Layer
from envbuild.build.ocilayout import write_oci_layout
from envbuild.errors import ExitCode, UnsafeArchive
from envbuild.lock.model import OciLayoutBaseLock, RootfsBaseLock
from envbuild.store.core import Store

from .tarcheck import COMPRESSIONS, compress, sha256
from .test_bases import member


def tar_bytes(members: list[tuple]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buf.getvalue()


def rootfs_from(tmp_path: Path, data: bytes, name: str = "root.tar", **kw: object):
    path = tmp_path / name
    path.write_bytes(data)
    pin = RootfsBaseLock(kind="rootfs", path=name, sha256=sha256(data))
    store = Store(tmp_path / "store")
    return rootfs.from_tarball(store, path, pin, compression=Compression.NONE, **kw)  # type: ignore[arg-type]


def layout_of(tmp_path: Path, layers_raw: list[bytes]) -> tuple[Path, OciLayoutBaseLock]:
    store = Store(tmp_path / "src")
    layers = []
    for raw in layers_raw:
        blob = store.add_bytes(gzip.compress(raw, mtime=0))
        layers.append(
            Layer(
                digest=blob,
                diff_id="sha256:" + hashlib.sha256(raw).hexdigest(),
                size=store.blob_path(blob).stat().st_size,
                media_type="application/vnd.oci.image.layer.v1.tar+gzip",
                compression=Compression.GZIP,
                compressor="test",
                uncompressed_size=len(raw),
                entries=1,
                files=1,
                file_bytes=1,
            )
        )
    image = write_image(store, layers=layers, config=OciImageConfig())
    layout = write_oci_layout(store, image, tmp_path / "layout", ref_name="t")
    return layout, OciLayoutBaseLock(kind="oci-layout", path="layout", digest=image.manifest_digest)


# --- symlinks -----------------------------------------------------------------------------


LINK_THEN_BELOW = [
    member("lnk", tarfile.SYMTYPE, linkname="/tmp"),
    member("lnk/x", data=b"planted"),
]


def test_an_oci_layer_writing_through_its_own_symlink_is_refused(tmp_path):
    """Was accepted: the rootfs reader refused it, the OCI-layout reader did not."""
    layout, pin = layout_of(tmp_path, [tar_bytes(LINK_THEN_BELOW)])
    with pytest.raises(UnsafeArchive, match="lies below 'lnk', which is a symlink"):
        rootfs.from_oci_layout(Store(tmp_path / "store"), layout, pin)
    with pytest.raises(UnsafeArchive, match="lies below 'lnk', which is a symlink"):
        rootfs_from(tmp_path, tar_bytes(LINK_THEN_BELOW))


def test_an_oci_layer_writing_through_a_lower_layers_symlink_is_refused(tmp_path):
    layout, pin = layout_of(
        tmp_path, [tar_bytes(LINK_THEN_BELOW[:1]), tar_bytes(LINK_THEN_BELOW[1:])]
    )
    with pytest.raises(UnsafeArchive, match=r"layer 1 .*lies below 'lnk'"):
        rootfs.from_oci_layout(Store(tmp_path / "store"), layout, pin)


def test_a_lower_symlink_whited_out_may_become_a_folder(tmp_path):
    upper = [member(".wh.lnk"), member("lnk", tarfile.DIRTYPE), member("lnk/x", data=b"ok")]
    layout, pin = layout_of(tmp_path, [tar_bytes(LINK_THEN_BELOW[:1]), tar_bytes(upper)])
    base = rootfs.from_oci_layout(Store(tmp_path / "store"), layout, pin)
    assert len(base.layers) == 2


@pytest.mark.parametrize(
    ("members", "needle"),
    [
        # re-packing sorts paths: `d` (a symlink) would come before `d/x` and be written through
        ([member("d/x", data=b"x"), member("d", tarfile.SYMTYPE, linkname="/etc")],
         "holds members"),
        (
            [member("f", data=b"x"), member("h", tarfile.LNKTYPE, linkname="f"),
             member("f", tarfile.SYMTYPE, linkname="/etc/shadow")],
            "a hardlink names",
        ),
        ([member("h", tarfile.LNKTYPE, linkname="h")], "names no earlier regular file"),
        ([member(".", tarfile.SYMTYPE, linkname="/")], "replace the root"),
        ([member("a" * 256, data=b"x")], "longer than Linux takes"),
        ([member("x", data=b"x", uid=-1)], "impossible owner"),
        (
            [member("d", tarfile.DIRTYPE), member("s", tarfile.SYMTYPE, linkname="d/.."),
             member("d/up", tarfile.SYMTYPE, linkname="../.."), member("t", tarfile.SYMTYPE,
             linkname="d/up")],
            "points outside",
        ),
    ],
)  # fmt: skip
def test_more_ways_around_the_rules(tmp_path, members, needle):
    with pytest.raises(UnsafeArchive, match=needle):
        rootfs_from(tmp_path, tar_bytes(members))
    layout, pin = layout_of(tmp_path, [tar_bytes(members)])
    with pytest.raises(UnsafeArchive, match=needle):
        rootfs.from_oci_layout(Store(tmp_path / "store2"), layout, pin)


# --- sparse members ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [
        ["--format=gnu"],
        ["--format=pax", "--sparse-version=0.0"],
        ["--format=pax", "--sparse-version=0.1"],
        ["--format=pax", "--sparse-version=1.0"],
    ],
)
def test_a_sparse_member_is_refused_not_expanded(tmp_path, flags):
    """Was a 10 KB tarball that built a 4 GiB layer."""
    need("tar")
    tree = tmp_path / "tree"
    tree.mkdir()
    with (tree / "hole").open("wb") as f:
        f.truncate(4 * GIB)
        f.seek(GIB)
        f.write(b"data")
    tar = tmp_path / "sparse.tar"
    subprocess.run(["tar", "-C", tree, "--sparse", *flags, "-cf", tar, "hole"], check=True)
    data = gzip.compress(tar.read_bytes(), mtime=0)
    assert len(data) < 10_000
    with pytest.raises(UnsafeArchive, match="sparse") as caught:
        rootfs_from(tmp_path, data, "sparse.tar.gz")
    assert caught.value.exit_code == ExitCode.USER_ERROR
    assert "sparse.tar.gz" in str(caught.value)
    store_bytes = sum(p.stat().st_size for p in (tmp_path / "store").rglob("*") if p.is_file())
    assert store_bytes < 1 << 20
    layout, pin = layout_of(tmp_path, [tar.read_bytes()])
    with pytest.raises(UnsafeArchive, match="sparse"):
        rootfs.from_oci_layout(Store(tmp_path / "store2"), layout, pin)


# --- compression ------------------------------------------------------------------------------

GOOD = [member("etc", tarfile.DIRTYPE), member("etc/os-release", data=b"ID=test\n" * 200)]


@pytest.mark.parametrize("how", COMPRESSIONS)
def test_each_compression_is_read(tmp_path, how):
    if how == "zstd":
        need("zstd")
    base = rootfs_from(tmp_path, compress(tar_bytes(GOOD), how), f"root.{how}")
    assert base.layers[0].files == 1


@pytest.mark.parametrize("how", [c for c in COMPRESSIONS if c != "none"])
def test_a_truncated_tarball_names_the_file(tmp_path, how):
    """Was `internal error: EOFError` (exit 4) for .tar.gz and .tar.xz."""
    if how == "zstd":
        need("zstd")
    data = compress(tar_bytes(GOOD), how)
    with pytest.raises(CorruptArchive) as caught:
        rootfs_from(tmp_path, data[: len(data) // 2], f"cut.tar.{how}")
    assert caught.value.exit_code == ExitCode.USER_ERROR
    assert f"cut.tar.{how}: " in str(caught.value)
    assert "truncated" in str(caught.value) or "corrupt" in str(caught.value)


def test_a_bad_gzip_crc_names_the_file(tmp_path):
    """Was exit 3 without the file's name."""
    data = bytearray(gzip.compress(tar_bytes(GOOD), mtime=0))
    data[-8] ^= 0xFF  # the CRC32 in the trailer
    with pytest.raises(CorruptArchive, match=r"crc\.tar\.gz: is truncated or corrupt \(gzip: CRC"):
        rootfs_from(tmp_path, bytes(data), "crc.tar.gz")


def test_a_corrupt_tar_header_midway_is_an_error_not_a_quiet_end(tmp_path):
    raw = bytearray(tar_bytes([*GOOD, member("etc/more", data=b"x")]))
    second = 512 + 512 * ((len(b"ID=test\n" * 200) + 511) // 512) + 512
    raw[second + 148 : second + 156] = b"0000000\0"  # a wrong header checksum
    with pytest.raises(CorruptArchive, match="corrupt tar header"):
        rootfs_from(tmp_path, bytes(raw))


def test_a_member_cut_short_is_an_error(tmp_path):
    raw = tar_bytes(GOOD)
    with pytest.raises(CorruptArchive, match="truncated"):
        rootfs_from(tmp_path, raw[:700])


# --- limits -----------------------------------------------------------------------------------


def test_expansion_is_bounded(tmp_path):
    big = [member("zeros", data=bytes(4 << 20))]
    data = compress(tar_bytes(big), "gzip")
    with pytest.raises(UnsafeArchive, match="expands to more than") as caught:
        rootfs_from(tmp_path, data, "bomb.tar.gz", limits=Limits(max_bytes=1 << 20))
    assert "max_unpacked_gib" in (caught.value.hint or "")
    assert not (tmp_path / "store" / "tmp").exists() or not any(
        p.stat().st_size > 2 << 20 for p in (tmp_path / "store" / "tmp").rglob("*") if p.is_file()
    )
    with pytest.raises(UnsafeArchive, match="expands more than 100 times"):
        rootfs_from(tmp_path, data, "bomb.tar.gz", limits=Limits(ratio_free=1 << 20))
    layout, pin = layout_of(tmp_path, [tar_bytes(big)])
    with pytest.raises(UnsafeArchive, match="expands to more than"):
        rootfs.from_oci_layout(
            Store(tmp_path / "s2"), layout, pin, limits=Limits(max_bytes=1 << 20)
        )
    assert rootfs_from(tmp_path, data, "ok.tar.gz", limits=Limits.of(0.01)).layers


def test_the_documented_defaults():
    limits = Limits()
    assert (limits.max_bytes, limits.max_ratio, limits.ratio_free) == (64 * GIB, 100, GIB)
    assert limits.max_members == 1_000_000
    assert Limits.of(200) == Limits(max_bytes=200 * GIB, max_ratio=None)


def test_members_are_bounded(tmp_path):
    many = [member(f"f{i}", data=b"") for i in range(50)]
    with pytest.raises(UnsafeArchive, match="more than 20 members"):
        rootfs_from(tmp_path, tar_bytes(many), limits=Limits(max_members=20))


def test_a_huge_long_name_header_is_refused(tmp_path):
    raw = tar_bytes([member("n" * 100 + "/" + "x" * 200, data=b"x")])
    info = tarfile.TarInfo("././@LongLink")
    info.type = tarfile.GNUTYPE_LONGNAME
    info.size = 2 << 20
    header = info.tobuf(tarfile.GNU_FORMAT)
    bomb = header + b"a" * (2 << 20) + raw
    with pytest.raises(UnsafeArchive, match="extended header"):
        rootfs_from(tmp_path, gzip.compress(bomb, mtime=0), "long.tar.gz")


def test_the_oci_layout_test_tools_agree(tmp_path):
    """A base both readers accept is accepted the same way (the same rules)."""
    need("zstd")
    data = tar_bytes(GOOD)
    rootfs_from(tmp_path, data)
    layout, pin = layout_of(tmp_path, [data])
    rootfs.from_oci_layout(Store(tmp_path / "s2"), layout, pin)
    shutil.rmtree(tmp_path / "s2")


def test_the_spec_sets_the_limit(tmp_path):
    """``base.max_unpacked_gib`` reaches the reader through build_base."""
    from envbuild.build.base.core import build_base
    from envbuild.spec.load import load_spec

    (tmp_path / ".git").mkdir()
    (tmp_path / "specs").mkdir()
    data = compress(tar_bytes([member("zeros", data=bytes(4 << 20))]), "gzip")
    (tmp_path / "root.tar.gz").write_bytes(data)
    spec = tmp_path / "specs" / "x.toml"
    body = (
        '[python]\nversion = "3.11"\nplatform = "manylinux_2_36_x86_64"\n'
        "[resolution]\nexclude_newer = 2025-01-01T00:00:00Z\n"
    )
    for limit, ok in (("0.001", False), ("1", True)):
        spec.write_text(
            f'[base]\nkind = "rootfs"\npath = "../root.tar.gz"\nsha256 = "{sha256(data)}"\n'
            f"max_unpacked_gib = {limit}\n" + body
        )
        store = Store(tmp_path / f"store-{limit}")
        if ok:
            assert build_base(store, load_spec(spec), compression=Compression.NONE).layers
        else:
            with pytest.raises(UnsafeArchive, match=r"expands to more than 0\.001 GiB"):
                build_base(store, load_spec(spec), compression=Compression.NONE)
