"""Reading an image's manifest and config from a registry (``apply --image``): whatever bytes
the registry sends, the answer is an image or an envbuild error (exit 2 or 3), never a
traceback; a well-formed envbuild image is read, with its venv layers and labels."""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from envbuild.apply.imagesource import ImageSource, open_image
from envbuild.errors import EnvbuildError
from envbuild.oci.layout import OCI_MANIFEST
from envbuild.registry.api import Endpoint, RegistryApi
from envbuild.registry.ref import ImageRef
from envbuild.store.core import Store


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Served(RegistryApi):
    """A registry that answers with given bytes (a subclass of the real client's)."""

    def __init__(self, manifest: bytes, config: bytes) -> None:
        super().__init__("registry.test", "fleet/img", Endpoint(insecure=True),
                         lookup_credentials=False)  # fmt: skip
        self.body, self.config = manifest, config

    def manifest_bytes(self, digest: str) -> bytes:
        return self.body

    def read_blob(self, digest: str, size: int, sink: Any, chunk: int = 1 << 20) -> int:
        sink.write(self.config[:size])
        return min(size, len(self.config))


def good_config() -> dict[str, Any]:
    return {
        "config": {"Env": ["VIRTUAL_ENV=/opt/venv"], "Labels": {"dev.envbuild.spec": "x"}},
        "rootfs": {"type": "layers", "diff_ids": [sha(b"base"), sha(b"venv"), sha(b"dist")]},
        "history": [
            {"created_by": "envbuild: rootfs tarball sha256:0123"},
            {"created_by": "envbuild venv venv", "comment": "k"},
            {"created_by": "envbuild dist tinydep: tinydep==1.0", "comment": "k"},
        ],
    }


def manifest_for(config: bytes, layers: int = 3) -> dict[str, Any]:
    layer = "application/vnd.oci.image.layer.v1.tar+zstd"
    return {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": sha(config), "size": len(config)},
        "layers": [{"mediaType": layer, "digest": sha(bytes([i])), "size": 10 + i}
                   for i in range(layers)],
    }  # fmt: skip


def read(manifest: bytes, config: bytes) -> ImageSource | EnvbuildError:
    with tempfile.TemporaryDirectory() as tmp:
        ref = ImageRef("registry.test", "fleet/img", digest=sha(manifest))
        try:
            return open_image(ref, Endpoint(insecure=True), Store(Path(tmp)),
                              api=Served(manifest, config))  # fmt: skip
        except EnvbuildError as exc:
            return exc


def test_an_envbuild_image_is_read_without_its_base_layer() -> None:
    config = json.dumps(good_config()).encode()
    src = read(json.dumps(manifest_for(config)).encode(), config)
    assert isinstance(src, ImageSource), src
    assert [(x.kind, x.name) for x in src.layers] == [("venv", "venv"), ("dist", "tinydep")]
    assert src.venv == "/opt/venv" and src.labels == {"dev.envbuild.spec": "x"}
    assert src.traffic.fetched == [sha(config)]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=12), kids,
                                                                max_size=4),
    max_leaves=20,
)  # fmt: skip


def _replace(doc: Any, path: list[int], value: Any) -> Any:
    """``doc`` with the node that ``path`` (indices into each level's keys or items) picks
    replaced by ``value``."""
    if not path or not isinstance(doc, (dict, list)) or not doc:
        return value
    keys = list(doc) if isinstance(doc, dict) else list(range(len(doc)))
    key = keys[path[0] % len(keys)]
    out = dict(doc) if isinstance(doc, dict) else list(doc)
    out[key] = _replace(doc[key], path[1:], value)  # type: ignore[index]
    return out


@settings(max_examples=300, deadline=None)
@given(
    which=st.sampled_from(["manifest", "config", "bytes"]),
    path=st.lists(st.integers(min_value=0, max_value=50), max_size=5),
    value=JSON,
    raw=st.binary(max_size=200),
)
def test_whatever_the_registry_sends_is_an_image_or_an_error(
    which: str, path: list[int], value: Any, raw: bytes
) -> None:
    config_doc: Any = good_config()
    if which == "config":
        config_doc = _replace(config_doc, path, value)
    config = raw if which == "bytes" and path[:1] == [0] else json.dumps(config_doc).encode()
    manifest_doc: Any = manifest_for(config)
    if which == "manifest":
        manifest_doc = _replace(manifest_doc, path, value)
    manifest = raw if which == "bytes" and path[:1] != [0] else json.dumps(manifest_doc).encode()
    got = read(manifest, config)
    assert isinstance(got, (ImageSource, EnvbuildError))
    if isinstance(got, ImageSource):  # what it read is what an image needs
        assert got.layers and got.layers[0].kind == "venv" and got.venv.startswith("/")


def test_no_tree_file_is_written_through_a_lower_layers_link(tmp_path: Path) -> None:
    """Trees reused from the store are not read through the archive rules again: linking them
    still refuses a file below a symlink an earlier layer made (``lib -> /elsewhere``)."""
    import hashlib as h

    import pytest

    from envbuild.apply.fromimage import _link
    from envbuild.errors import IntegrityError
    from envbuild.store.trees import TreeOf, Trees

    store = Store(tmp_path / "store")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    staged = tmp_path / "staged"
    staged.write_bytes(b"evil\n")
    trees = Trees(store)
    with store.session():
        lower = trees.create("a" * 64, TreeOf("venv", "", None, {}),
                             sources={}, digests={}, links={"lib": str(outside)})  # fmt: skip
        upper = trees.create("b" * 64, TreeOf("dist", "", None, {}),
                             sources={"lib/evil": staged},
                             digests={"lib/evil": h.sha256(b"evil\n").hexdigest()})  # fmt: skip
        with pytest.raises(IntegrityError, match="below the symlink lib"):
            _link(tmp_path / "venv", [lower, upper], store)
    assert list(outside.iterdir()) == []
