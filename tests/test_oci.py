"""The one OCI layout reader (envbuild.oci): what it reads back, what it picks, and that any
layout at all, however malformed, gives an image or an envbuild error (exit 2; exit 3 only for
bytes that differ from their digest), never another exception.

Layouts here are written by hand (JSON blobs, no layers to pack), so hundreds of them cost
little; envbuild's own writer is read back in tests/build/test_image.py.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envbuild.errors import EnvbuildError, ExitCode, InputFileError, IntegrityError
from envbuild.oci.blobs import verify_layout
from envbuild.oci.layout import (
    DOCKER_MANIFEST,
    DOCKER_MANIFEST_LIST,
    MAX_CONFIG,
    MAX_DOCUMENT,
    OCI_CONFIG,
    OCI_INDEX,
    OCI_LAYOUT,
    OCI_MANIFEST,
    REF_NAME,
    LayoutImage,
    open_layout,
    read_index,
    select_manifest,
)

LAYER = "application/vnd.oci.image.layer.v1.tar"
SBOM = "application/vnd.cyclonedx+json"


class Layout:
    """A layout written blob by blob."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
        (root / "oci-layout").write_bytes(OCI_LAYOUT)

    def blob(self, data: bytes | Any, media_type: str, **extra: Any) -> dict[str, Any]:
        raw = data if isinstance(data, bytes) else json.dumps(data).encode()
        hexdigest = hashlib.sha256(raw).hexdigest()
        (self.root / "blobs" / "sha256" / hexdigest).write_bytes(raw)
        return {"mediaType": media_type, "digest": f"sha256:{hexdigest}", "size": len(raw), **extra}

    def path(self, desc: dict[str, Any]) -> Path:
        return self.root / "blobs" / "sha256" / desc["digest"][7:]

    def image(self, *, layers: int = 1, media_type: str = OCI_MANIFEST, **extra: Any) -> dict:
        config = self.blob({"architecture": "amd64", "os": "linux", "rootfs": {}}, OCI_CONFIG)
        listed = [self.blob(tar_of(f"layer-{i}"), LAYER) for i in range(layers)]
        doc = {"schemaVersion": 2, "mediaType": media_type, "config": config, "layers": listed}
        return self.blob(doc, media_type, **extra)

    def index(self, *entries: dict[str, Any]) -> None:
        doc = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": list(entries)}
        (self.root / "index.json").write_text(json.dumps(doc))


def tar_of(name: str) -> bytes:
    """A tar of one empty file: a layer's bytes must be what its media type says."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        tf.addfile(tarfile.TarInfo(name), io.BytesIO(b""))
    return buf.getvalue()


def tagged(name: str) -> dict[str, Any]:
    return {"annotations": {REF_NAME: name}}


def linux(arch: str) -> dict[str, Any]:
    return {"platform": {"os": "linux", "architecture": arch}}


def user_error(exc: BaseException) -> bool:
    return isinstance(exc, InputFileError) and exc.exit_code == ExitCode.USER_ERROR


# --- what a good layout reads as ----------------------------------------------------------------


def test_the_only_image_is_read_with_its_config_and_layers(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    desc = lay.image(layers=2, **tagged("t"))
    lay.index(desc)
    image = open_layout(tmp_path)
    assert image.manifest.digest == desc["digest"] and image.manifest.size == desc["size"]
    assert [d.media_type for d in image.layers] == [LAYER, LAYER]
    assert image.blobs == (image.config, *image.layers)
    assert image.size == desc["size"] + sum(d.size for d in image.blobs)
    assert image.read_config()["architecture"] == "amd64"
    assert image.artifact_type == OCI_CONFIG
    assert image.blob_path(image.config) == image.blob_path(image.config.digest)
    assert open_layout(tmp_path, "t") == image
    assert open_layout(tmp_path, digest=desc["digest"]) == image
    verify_layout(image)


def test_a_referrer_is_not_an_image_but_can_be_named_by_digest(tmp_path: Path) -> None:
    """An SBOM listed beside the image (with its artifactType) is skipped by every reader,
    the lock's included (it used to count it and call the layout ambiguous)."""
    lay = Layout(tmp_path)
    image = lay.image()
    art = lay.blob(
        {"mediaType": OCI_MANIFEST, "artifactType": SBOM, "config": lay.blob(b"{}", SBOM)},
        OCI_MANIFEST,
        artifactType=SBOM,
    )
    lay.index(image, art)
    assert [d.digest for d in read_index(tmp_path).images] == [image["digest"]]
    assert open_layout(tmp_path).manifest.digest == image["digest"]
    assert open_layout(tmp_path, digest=art["digest"]).artifact_type == SBOM


def test_a_docker_manifest_is_an_image(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    lay.index(lay.image(media_type=DOCKER_MANIFEST))
    assert open_layout(tmp_path).manifest.media_type == DOCKER_MANIFEST


def test_choosing_among_several_images(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    a, b = lay.image(**tagged("a")), lay.image(layers=2, **tagged("b"))
    lay.index(a, b)
    assert open_layout(tmp_path, "b").manifest.digest == b["digest"]
    with pytest.raises(InputFileError, match=r"has 2 images \(found: a, b\)"):
        open_layout(tmp_path)
    with pytest.raises(InputFileError, match=r"has no image tagged 'c' \(found: a, b\)"):
        open_layout(tmp_path, "c")


def test_an_index_is_followed_to_the_platform_asked_for(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    arm, amd = lay.image(**linux("arm64")), lay.image(layers=3, **linux("amd64"))
    for kind in (OCI_INDEX, DOCKER_MANIFEST_LIST):
        top = lay.blob({"mediaType": kind, "manifests": [arm, amd]}, kind)
        lay.index(top)
        assert open_layout(tmp_path, architecture="amd64").manifest.digest == amd["digest"]
        assert select_manifest(tmp_path).digest == top["digest"]  # what the lock pins
        with pytest.raises(InputFileError, match="is an index of images"):
            open_layout(tmp_path)  # push and pull take single-platform images only
        with pytest.raises(InputFileError, match="without a linux/s390x image"):
            open_layout(tmp_path, architecture="s390x")
    # a digest the index does not list (the platform's manifest) is looked up in blobs/
    assert open_layout(tmp_path, digest=arm["digest"]).manifest.media_type == OCI_MANIFEST


def test_indexes_nested_too_deep_are_refused(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    desc = lay.image(**linux("amd64"))
    for _ in range(4):
        desc = lay.blob({"mediaType": OCI_INDEX, "manifests": [desc]}, OCI_INDEX, **linux("amd64"))
    lay.index(desc)
    with pytest.raises(InputFileError, match="nested more than 4 deep"):
        open_layout(tmp_path, architecture="amd64")


# --- what is refused, and how -------------------------------------------------------------------


@pytest.mark.parametrize(
    "media_type",
    ["", "application/vnd.oci.image.layer.v1.tar", "application/json", OCI_CONFIG],
)
def test_a_listed_document_of_another_type_is_refused(tmp_path: Path, media_type: str) -> None:
    """The image reader of the build sniffed an index by its keys and took any type; push took
    only the two manifest types: the one reader takes manifests and follows indexes, by type."""
    lay = Layout(tmp_path)
    desc = lay.image()
    lay.index({**desc, "mediaType": media_type})
    with pytest.raises(InputFileError, match="document, not an image manifest") as err:
        open_layout(tmp_path, architecture="amd64")
    assert err.value.exit_code == ExitCode.USER_ERROR


def test_a_document_listed_under_another_type_is_refused(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    lay.index(lay.image(media_type=OCI_MANIFEST) | {"mediaType": DOCKER_MANIFEST})
    with pytest.raises(InputFileError, match="listed as a"):
        open_layout(tmp_path)


def test_missing_files_are_user_errors(tmp_path: Path) -> None:
    """A missing blob was exit 2 for the build's reader and exit 3 for push's: a layout
    without a blob it lists is incomplete input, exit 2."""
    lay = Layout(tmp_path)
    desc = lay.image()
    lay.index(desc)
    image = open_layout(tmp_path)
    lay.path(image.layers[0].to_json()).unlink()
    with pytest.raises(InputFileError, match="is incomplete: blob sha256:"):
        verify_layout(image)
    lay.path(image.config.to_json()).unlink()
    with pytest.raises(InputFileError, match="is incomplete"):
        image.read_config()
    lay.path(desc).unlink()
    with pytest.raises(InputFileError, match="is incomplete"):
        open_layout(tmp_path)
    for name in ("index.json", "oci-layout"):
        (tmp_path / name).unlink()
        with pytest.raises(InputFileError, match=f"is not an OCI image layout \\(no {name}\\)"):
            open_layout(tmp_path)


def test_bytes_that_differ_from_their_digest_are_integrity_errors(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    desc = lay.image()
    lay.index(desc)
    image = open_layout(tmp_path)
    layer = lay.path(image.layers[0].to_json())
    layer.write_bytes(b"LAYER 0")  # same size, other bytes
    with pytest.raises(IntegrityError, match="does not match its digest"):
        verify_layout(image)
    layer.write_bytes(b"layer 0 and more")
    with pytest.raises(IntegrityError):
        verify_layout(image)
    lay.path(desc).write_bytes(lay.path(desc).read_bytes().replace(b"2", b"3", 1))
    with pytest.raises(IntegrityError) as err:
        open_layout(tmp_path)
    assert err.value.exit_code == ExitCode.ENVIRONMENT


def test_huge_sizes_are_refused_without_reading(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    desc = lay.image()
    lay.index({**desc, "size": 10**18})
    with pytest.raises(InputFileError, match="more than the 4194304"):
        open_layout(tmp_path)
    big = lay.root / "index.json"
    with big.open("r+b") as f:
        f.truncate(MAX_DOCUMENT + 1)  # sparse: nothing is read to find it too big
    with pytest.raises(InputFileError, match="more than the"):
        read_index(tmp_path)
    lay.index(desc)
    image = open_layout(tmp_path)
    huge_config = image.config.__class__(OCI_CONFIG, image.config.digest, MAX_CONFIG + 1)
    with pytest.raises(InputFileError, match="more than the"):
        LayoutImage(tmp_path, image.manifest, image.document, huge_config, ()).read_config()
    huge_layer = image.layers[0].__class__(LAYER, image.layers[0].digest, 10**18)
    with pytest.raises(IntegrityError):
        verify_layout(LayoutImage(tmp_path, image.manifest, image.document, image.config,
                                  (huge_layer,)))  # fmt: skip


def test_blobs_that_are_not_regular_files(tmp_path: Path) -> None:
    """A symlink to the right bytes reads; to a device, a fifo, a folder, nowhere or itself
    is refused, a fifo without blocking on it."""
    lay = Layout(tmp_path / "layout")
    desc = lay.image()
    lay.index(desc)
    blob = lay.path(desc)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(blob, elsewhere)
    blob.symlink_to(elsewhere)
    assert open_layout(lay.root).manifest.digest == desc["digest"]
    for make in (
        lambda: blob.symlink_to("/dev/zero"),
        lambda: os.mkfifo(blob),
        lambda: blob.mkdir(),
        lambda: blob.symlink_to(tmp_path / "nowhere"),
        lambda: blob.symlink_to(blob),
    ):
        if blob.is_dir() and not blob.is_symlink():
            blob.rmdir()
        else:
            blob.unlink(missing_ok=True)
        make()
        with pytest.raises(InputFileError) as err:
            open_layout(lay.root)
        assert err.value.exit_code == ExitCode.USER_ERROR


@pytest.mark.parametrize(
    "digest",
    ["sha256:../../../etc/passwd", "sha512:" + "0" * 128, "sha256:" + "A" * 64, 7, None],
)
def test_a_digest_never_names_a_path_outside_blobs(tmp_path: Path, digest: Any) -> None:
    lay = Layout(tmp_path)
    desc = lay.image()
    lay.index({**desc, "digest": digest})
    with pytest.raises(InputFileError, match="malformed descriptor"):
        open_layout(tmp_path)
    with pytest.raises(InputFileError):
        open_layout(tmp_path, digest=str(digest))


# --- any layout at all --------------------------------------------------------------------------

KEYS = ["manifests", "mediaType", "digest", "size", "annotations", "artifactType", "platform",
        "config", "layers", "os", "architecture", REF_NAME]  # fmt: skip
LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-2, max_value=2**70), st.text(max_size=6),
    st.sampled_from([OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, "linux", "amd64", REF_NAME,
                     "sha256:" + "0" * 64]),
)  # fmt: skip
json_values = st.recursive(
    LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=4)), inner, max_size=5),
    ),
    max_leaves=20,
)
PROPS = settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def read_all(root: Path) -> LayoutImage | None:
    """Everything a caller of the reader does: open (following an index), read the config,
    verify the blobs. None when the layout was refused as it must be."""
    try:
        image = open_layout(root, architecture="amd64")
        image.read_config()
        verify_layout(image)
    except IntegrityError:
        return None
    except EnvbuildError as exc:
        assert user_error(exc), exc
        return None
    return image


@PROPS
@given(index=json_values, raw=st.binary(max_size=64))
def test_any_index_json(tmp_path: Path, index: Any, raw: bytes) -> None:
    for text in (json.dumps(index).encode(), raw):
        root = tmp_path / "l"
        shutil.rmtree(root, ignore_errors=True)
        Layout(root)
        (root / "index.json").write_bytes(text)
        assert read_all(root) is None  # nothing it could name is in blobs/


@PROPS
@given(document=json_values, config=json_values, listed=st.sampled_from(sorted(KEYS[:3])))
def test_any_manifest_and_config(tmp_path: Path, document: Any, config: Any, listed: str) -> None:
    """A manifest and config of any shape, stored under their true digests and sizes (so only
    their shape can be wrong), where a real manifest would name them where it has room."""
    root = tmp_path / "l"
    shutil.rmtree(root, ignore_errors=True)
    lay = Layout(root)
    config_desc = lay.blob(config, OCI_CONFIG)
    if isinstance(document, dict) and listed != "manifests":
        document.setdefault("config", config_desc)
        document.setdefault("layers", [lay.blob(b"x", LAYER)])
    kind = OCI_INDEX if isinstance(document, dict) and "manifests" in document else OCI_MANIFEST
    lay.index(lay.blob(document, kind))
    image = read_all(root)
    if image is not None:
        assert image.document == document


MUTATIONS = ["drop", "flip", "truncate", "grow", "symlink", "fifo", "size", "type", "junk"]


@PROPS
@given(
    target=st.sampled_from(["index.json", "oci-layout", "manifest", "config", "layer"]),
    mutation=st.sampled_from(MUTATIONS),
    at=st.integers(min_value=0, max_value=10**6),
)
def test_a_damaged_good_layout(tmp_path: Path, target: str, mutation: str, at: int) -> None:
    """One file of a good layout damaged: the image as it was, exit 2, or an integrity error
    (only when the file's bytes differ from the digest it is listed under)."""
    root = tmp_path / "l"
    shutil.rmtree(root, ignore_errors=True)
    lay = Layout(root)
    desc = lay.image(layers=2)
    lay.index(desc)
    good = open_layout(root)
    paths = {
        "index.json": root / "index.json",
        "oci-layout": root / "oci-layout",
        "manifest": good.blob_path(good.manifest),
        "config": good.blob_path(good.config),
        "layer": good.blob_path(good.layers[at % 2]),
    }
    path = paths[target]
    data = path.read_bytes()
    path.unlink()
    if mutation == "flip":
        i = at % len(data)
        path.write_bytes(data[:i] + bytes([data[i] ^ 0x20]) + data[i + 1 :])
    elif mutation == "truncate":
        path.write_bytes(data[: at % len(data)])
    elif mutation == "grow":
        path.write_bytes(data + b" ")
    elif mutation == "symlink":
        (tmp_path / "moved").write_bytes(data)
        path.symlink_to(tmp_path / "moved")
    elif mutation == "fifo":
        os.mkfifo(path)
    elif mutation in ("size", "type") and target == "index.json":
        key, value = ("size", at) if mutation == "size" else ("mediaType", OCI_CONFIG)
        lay.index({**desc, key: value})
    elif mutation == "junk":
        path.write_bytes(b"\x00{[" * (at % 5))
    elif mutation != "drop":
        path.write_bytes(data)
    image = read_all(root)
    assert image is None or image == good


def test_a_digest_with_a_trailing_newline_is_not_a_digest() -> None:
    """``$`` would let ``sha256:<hex>\\n`` through: a path built from it then names another file."""
    from envbuild.oci.layout import DIGEST_RE

    good = "sha256:" + "a" * 64
    assert DIGEST_RE.match(good)
    assert not DIGEST_RE.match(good + "\n")
