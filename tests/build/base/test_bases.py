"""Bases: malicious tarballs refused with nothing written outside; rootfs tarballs, OCI layouts
and registry images imported as pinned; a Debian base built twice gives one digest."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
from support.debianbase import DebianRootfs, need
from support.treelayer import layer_from_tree

from envbuild.build.base import debian, registry, rootfs
from envbuild.build.base.tarread import safe_extract
from envbuild.build.entries import Entry, Kind, opaque, whiteout
from envbuild.build.image import History, OciImageConfig, write_image
from envbuild.build.layers import Compression, write_layer
from envbuild.build.ocilayout import write_oci_layout
from envbuild.errors import ExitCode, IntegrityError, ManifestError, ToolFailed, UnsafeArchive
from envbuild.lock.model import ImageBaseLock, OciLayoutBaseLock, RootfsBaseLock
from envbuild.oci.compression import open_uncompressed
from envbuild.store.core import Store


def member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", **kw: object) -> tuple:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    for key, value in kw.items():
        setattr(info, key, value)
    return info, data


def make_tar(path: Path, members: list[tuple], *, compress: bool = False) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if info.isreg() else None)
    raw = buf.getvalue()
    path.write_bytes(gzip.compress(raw, mtime=0) if compress else raw)
    return path


def malicious(outside: Path) -> dict[str, list[tuple]]:
    return {
        "dotdot": [member("etc", tarfile.DIRTYPE), member("../escape.txt", data=b"x")],
        "deep-dotdot": [member("a/../../escape.txt", data=b"x")],
        "absolute": [member(str(outside / "abs.txt"), data=b"x")],
        "symlink-out": [member("evil", tarfile.SYMTYPE, linkname="../../../..")],
        "through-symlink": [
            member("evil", tarfile.SYMTYPE, linkname=str(outside)),
            member("evil/planted.txt", data=b"x"),
        ],
        "relative-through-symlink": [
            member("d", tarfile.DIRTYPE),
            member("d/up", tarfile.SYMTYPE, linkname=".."),
            member("up2", tarfile.SYMTYPE, linkname="d/up/../.."),
        ],
        "hardlink-out": [member("h", tarfile.LNKTYPE, linkname="../../outside/secret")],
        "hardlink-absolute": [member("h", tarfile.LNKTYPE, linkname="/etc/passwd")],
        "device": [member("etc/null", tarfile.CHRTYPE, devmajor=1, devminor=3)],
    }


CASES = sorted(malicious(Path("/x")))


def snapshot(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("case", CASES)
def test_malicious_rootfs_tarball_is_refused(tmp_path, case):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("keep me")
    tar = make_tar(tmp_path / "evil.tar.gz", malicious(outside)[case], compress=True)
    store = Store(tmp_path / "store")
    pin = RootfsBaseLock(
        kind="rootfs", path="evil.tar.gz", sha256=hashlib.sha256(tar.read_bytes()).hexdigest()
    )
    before = snapshot(tmp_path)
    with pytest.raises(UnsafeArchive):
        rootfs.from_tarball(store, tar, pin)
    assert list(store.blobs.iterdir()) == []
    assert store.derivations() == []

    target = tmp_path / "target"
    with pytest.raises(UnsafeArchive), gzip.open(tar) as stream:
        safe_extract(stream, target, where="evil.tar.gz")
    after = [p for p in snapshot(tmp_path) if not p.startswith(("target", "store"))]
    assert after == [p for p in before if not p.startswith("store")]
    assert snapshot(outside) == ["secret"]
    assert (outside / "secret").read_text() == "keep me"


def good_rootfs_members(order: int = 1) -> list[tuple]:
    members = [
        member("./", tarfile.DIRTYPE, mode=0o755),
        member("./bin", tarfile.DIRTYPE, mode=0o755),
        member("./bin/su", data=b"\x7fELF su", mode=0o4755),
        member("./bin/sh", tarfile.SYMTYPE, linkname="/usr/bin/dash", mode=0o777),
        member("./etc", tarfile.DIRTYPE, mode=0o755),
        member("./etc/shadow", data=b"root:*:", mode=0o640, gid=42),
        member("./tmp", tarfile.DIRTYPE, mode=0o1777),
        member("./usr/bin/z-first", data=b"shared inode", mode=0o755),
        member("./usr/bin/a-second", tarfile.LNKTYPE, linkname="./usr/bin/z-first"),
        member("./dev", tarfile.DIRTYPE, mode=0o755),
        member("./dev/null", tarfile.CHRTYPE, devmajor=1, devminor=3, mode=0o666),
    ]
    return members if order == 1 else [*members[:1], *reversed(members[1:7]), *members[7:]]


def test_a_rootfs_tarball_is_repacked_with_modes_and_owners(tmp_path):
    tar = make_tar(tmp_path / "root.tar.gz", good_rootfs_members(), compress=True)
    sha = hashlib.sha256(tar.read_bytes()).hexdigest()
    store = Store(tmp_path / "store")
    base = rootfs.from_tarball(store, tar, RootfsBaseLock(kind="rootfs", path="r", sha256=sha))
    (layer,) = base.layers
    assert base.config.env["PATH"].startswith("/usr/local/sbin")
    with open_uncompressed(store.blob_path(layer.digest), layer.media_type) as f:
        data = f.read()
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        listing = {m.name: m for m in tf}
    assert "dev/null" not in listing and "dev" in listing
    assert listing["bin/su"].mode == 0o4755
    assert listing["tmp"].mode == 0o1777
    assert (listing["etc/shadow"].mode, listing["etc/shadow"].gid) == (0o640, 42)
    assert listing["bin/sh"].linkname == "/usr/bin/dash"
    # hardlinks: the first path in sort order holds the content
    assert listing["usr/bin/a-second"].isreg()
    assert (
        listing["usr/bin/z-first"].islnk()
        and listing["usr/bin/z-first"].linkname == "usr/bin/a-second"
    )
    assert base.history[0].created_by.startswith("envbuild: rootfs tarball")

    shuffled = make_tar(tmp_path / "shuffled.tar", good_rootfs_members(order=2))
    sha2 = hashlib.sha256(shuffled.read_bytes()).hexdigest()
    other = rootfs.from_tarball(
        Store(tmp_path / "s2"), shuffled, RootfsBaseLock(kind="rootfs", path="s", sha256=sha2)
    )
    assert other.layers[0].digest == layer.digest

    with pytest.raises(IntegrityError, match="sha256"):
        rootfs.from_tarball(
            Store(tmp_path / "s3"), tar, RootfsBaseLock(kind="rootfs", path="r", sha256="0" * 64)
        )


def test_safe_extract_applies_layers_and_whiteouts(tmp_path):
    store = Store(tmp_path / "store")
    lower = write_layer(
        store,
        [
            Entry("app/keep.txt", Kind.FILE, size=4, source=make_file(tmp_path / "k", b"keep")),
            Entry("app/old.txt", Kind.FILE, size=3, source=make_file(tmp_path / "o", b"old")),
            Entry("data/a", Kind.FILE, size=1, source=make_file(tmp_path / "a", b"a")),
            Entry("link", Kind.SYMLINK, 0o777, linkname="/app/keep.txt"),
        ],
    )
    upper = write_layer(
        store,
        [
            whiteout("app/old.txt"),
            opaque("data"),
            Entry("data/b", Kind.FILE, size=1, source=make_file(tmp_path / "b", b"b")),
        ],
    )
    target = tmp_path / "rootfs"
    for layer in (lower, upper):
        with open_uncompressed(store.blob_path(layer.digest), layer.media_type) as f:
            safe_extract(f, target, where=layer.digest)
    assert snapshot(target) == ["app", "app/keep.txt", "data", "data/b", "link"]
    assert os.readlink(target / "link") == "/app/keep.txt"
    assert (target / "data" / "b").read_bytes() == b"b"


def make_file(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def small_image(tmp_path: Path, store: Store, compression: Compression = Compression.GZIP):
    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True, exist_ok=True)
    (tree / "etc" / "os-release").write_text("ID=test\n")
    layer = layer_from_tree(store, tree, compression=compression)
    config = OciImageConfig(env={"PATH": "/bin", "FROM_BASE": "1"}, cmd=["/bin/sh"])
    return write_image(store, layers=[layer], config=config, history=[History(created_by="t")])


def test_an_oci_layout_base_is_imported_and_verified(tmp_path):
    src_store = Store(tmp_path / "src")
    image = small_image(tmp_path, src_store)
    layout = write_oci_layout(src_store, image, tmp_path / "layout", ref_name="base")
    pin = OciLayoutBaseLock(kind="oci-layout", path="layout", digest=image.manifest_digest)
    store = Store(tmp_path / "store")
    base = rootfs.from_oci_layout(store, layout, pin)
    assert [x.digest for x in base.layers] == [x.digest for x in image.layers]
    assert [x.diff_id for x in base.layers] == [x.diff_id for x in image.layers]
    assert base.config.env == {"PATH": "/bin", "FROM_BASE": "1"}
    assert base.config.cmd == ["/bin/sh"]
    assert [h.created_by for h in base.history] == ["t"]
    assert store.has_blob(image.layers[0].digest)

    layer_file = layout / "blobs" / "sha256" / image.layers[0].digest.split(":")[1]
    layer_file.unlink()
    layer_file.write_bytes(b"tampered")
    with pytest.raises(IntegrityError):
        rootfs.from_oci_layout(Store(tmp_path / "s2"), layout, pin)


def test_a_wrong_diff_id_is_bad_input_naming_the_layer(tmp_path):
    """The layer is the bytes its digest names, the config says it uncompresses to something
    else: the base is wrong (exit 2, the layer named), not damaged on the way (exit 3)."""
    store = Store(tmp_path / "src")
    raw = make_tar(tmp_path / "ok.tar", good_rootfs_members()).read_bytes()
    blob = store.add_bytes(gzip.compress(raw, mtime=0))
    from envbuild.build.layers import Layer

    wrong = "sha256:" + hashlib.sha256(raw + b"x").hexdigest()
    layer = Layer(
        digest=blob, diff_id=wrong, size=store.blob_path(blob).stat().st_size,
        media_type="application/vnd.oci.image.layer.v1.tar+gzip", compression=Compression.GZIP,
        compressor="test", uncompressed_size=len(raw), entries=1, files=1, file_bytes=1,
    )  # fmt: skip
    image = write_image(store, layers=[layer], config=OciImageConfig())
    layout = write_oci_layout(store, image, tmp_path / "layout", ref_name="wrong")
    pin = OciLayoutBaseLock(kind="oci-layout", path="layout", digest=image.manifest_digest)
    with pytest.raises(ManifestError) as err:
        rootfs.from_oci_layout(Store(tmp_path / "store"), layout, pin)
    assert err.value.exit_code == ExitCode.USER_ERROR
    right = "sha256:" + hashlib.sha256(raw).hexdigest()
    assert f"layer 0 ({blob}) uncompresses to {right}" in err.value.message
    assert f"rootfs.diff_ids[0] says {wrong}" in err.value.message


def test_an_oci_layout_with_a_malicious_layer_is_refused(tmp_path):
    store = Store(tmp_path / "src")
    tar = make_tar(tmp_path / "evil.tar", [member("../../escape", data=b"x")])
    raw = tar.read_bytes()
    blob = store.add_bytes(gzip.compress(raw, mtime=0))
    from envbuild.build.layers import Layer

    layer = Layer(
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
    image = write_image(store, layers=[layer], config=OciImageConfig())
    layout = write_oci_layout(store, image, tmp_path / "layout", ref_name="evil")
    pin = OciLayoutBaseLock(kind="oci-layout", path="layout", digest=image.manifest_digest)
    with pytest.raises(UnsafeArchive, match="climbs out"):
        rootfs.from_oci_layout(Store(tmp_path / "store"), layout, pin)


@pytest.mark.registry
def test_a_registry_image_is_pulled_by_digest_and_checked(tmp_path, registry):
    need("skopeo")
    src = Store(tmp_path / "src")
    image = small_image(tmp_path, src)
    layout = write_oci_layout(src, image, tmp_path / "layout", ref_name="v1")
    # pushed as a Docker v2s2 manifest: its digest is the registry's, and Docker media types
    # must come back as their OCI equivalents
    dest = f"docker://{registry.ref('envbuild/base', 'v1')}"
    subprocess.run(
        [
            "skopeo",
            "copy",
            "--quiet",
            "--format",
            "v2s2",
            "--dest-tls-verify=false",
            f"oci:{layout}:v1",
            dest,
        ],
        check=True,
        capture_output=True,
    )
    raw = subprocess.run(
        ["skopeo", "inspect", "--raw", "--tls-verify=false", dest],
        check=True,
        capture_output=True,
    ).stdout
    digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    assert json.loads(raw)["mediaType"] == "application/vnd.docker.distribution.manifest.v2+json"
    pin = ImageBaseLock(kind="image", ref=registry.ref("envbuild/base"), digest=digest)
    store = Store(tmp_path / "store")
    base = registry_pull(store, pin)
    assert [x.digest for x in base.layers] == [x.digest for x in image.layers]
    assert [x.media_type for x in base.layers] == [x.media_type for x in image.layers]
    assert base.config.env["FROM_BASE"] == "1"
    assert store.has_blob(digest)
    again = registry_pull(store, pin)  # a derivation: not pulled twice
    assert again == base

    wrong = ImageBaseLock(kind="image", ref=pin.ref, digest="sha256:" + "1" * 64)
    with pytest.raises(ToolFailed):
        registry_pull(Store(tmp_path / "s2"), wrong)


def registry_pull(store: Store, pin: ImageBaseLock):
    return registry.pull(store, pin, tls_verify=False)


@pytest.mark.slow
def test_the_debian_base_is_reproducible_bit_for_bit(
    tmp_path, debian_rootfs: DebianRootfs, monkeypatch: pytest.MonkeyPatch
):
    """The pinned set built again, into another store, at another time, with another umask,
    its chroot on another file system (the resolving run's went to /dev/shm where it could):
    the same layer digest as the resolving run, and the chroot's folder is gone after."""
    chroots = tmp_path / "chroots"
    chroots.mkdir()
    monkeypatch.setenv("ENVBUILD_SCRATCH", str(chroots))
    old = os.umask(0o077)
    try:
        again = debian.build(Store(tmp_path / "other"), debian_rootfs.spec, debian_rootfs.lock)
    finally:
        os.umask(old)
    assert list(chroots.iterdir()) == []
    assert again.layers[0].digest == debian_rootfs.base.layers[0].digest
    assert again.key == debian_rootfs.base.key
    names = {p.name for p in debian_rootfs.lock.packages}
    assert {"python3-minimal", "base-files", "dpkg"} <= names
    assert all(len(p.sha256) == 64 for p in debian_rootfs.lock.packages)


@pytest.mark.slow
def test_the_debian_base_records_its_setuid_files(debian_rootfs: DebianRootfs):
    """bookworm's essential set ships setuid programs (su, mount, passwd …): kept, since a base
    needs them, and recorded like any other base's, for the build manifest, `build` and `diff`."""
    setid = debian_rootfs.base.setid
    assert setid, "the Debian base recorded no setuid/setgid file"
    assert setid.get("usr/bin/su") == "4755", setid
    assert all(int(mode, 8) & 0o6000 for mode in setid.values()), setid
