"""An OCI layout base without ``base.digest``: the lock pins the one image its index lists,
read by envbuild.oci (a referrer such as the image's SBOM is not an image), and a layout that
cannot be read is a spec error at ``base.path``."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from envbuild.errors import SpecError
from envbuild.lock.base import lock_base
from envbuild.lock.model import OciLayoutBaseLock
from envbuild.oci.layout import OCI_LAYOUT, OCI_MANIFEST
from envbuild.spec.load import load_spec

BODY = (
    '[python]\nversion = "3.11"\nplatform = "manylinux_2_36_x86_64"\n'
    "[resolution]\nexclude_newer = 2025-01-01T00:00:00Z\n"
)


def repo(tmp_path: Path, entries: list[dict]) -> Path:
    (tmp_path / ".git").mkdir()
    (tmp_path / "specs").mkdir()
    layout = tmp_path / "layout"
    layout.mkdir()
    (layout / "oci-layout").write_bytes(OCI_LAYOUT)
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": entries}))
    spec = tmp_path / "specs" / "x.toml"
    spec.write_text('[base]\nkind = "oci-layout"\npath = "../layout"\n' + BODY)
    return spec


def entry(name: str, **extra: str) -> dict:
    digest = "sha256:" + hashlib.sha256(name.encode()).hexdigest()
    return {"mediaType": OCI_MANIFEST, "digest": digest, "size": 10, **extra}


def test_the_sbom_beside_the_image_does_not_make_the_base_ambiguous(tmp_path: Path) -> None:
    image = entry("image")
    spec = repo(tmp_path, [image, entry("sbom", artifactType="application/vnd.cyclonedx+json")])
    base = lock_base(load_spec(spec))
    assert isinstance(base, OciLayoutBaseLock)
    assert (base.path, base.digest) == ("layout", image["digest"])


def test_two_images_are_ambiguous(tmp_path: Path) -> None:
    spec = repo(tmp_path, [entry("a"), entry("b")])
    with pytest.raises(SpecError, match="lists 2 images") as err:
        lock_base(load_spec(spec))
    assert err.value.problems[0].key == "base.path"


@pytest.mark.parametrize(
    "bad", [[{"digest": "sha256:../x", "size": 1}], [{"mediaType": OCI_MANIFEST}], [7]]
)
def test_a_malformed_index_is_a_spec_error_at_base_path(tmp_path: Path, bad: list) -> None:
    spec = repo(tmp_path, bad)
    with pytest.raises(SpecError, match="cannot be read as an OCI index") as err:
        lock_base(load_spec(spec))
    assert err.value.problems[0].key == "base.path"
