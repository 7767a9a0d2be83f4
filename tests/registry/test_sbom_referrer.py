"""The image's SBOM travels with it: `envbuild push` sends the layout's referrer (OCI 1.1, with
the referrers tag schema where the registry has no referrers API, as Debian's docker-registry),
`envbuild pull` brings it back into the new layout, every digest checked; skopeo reads the
artifact from the registry."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.registry import Registry
from support.treelayer import layer_from_tree

from envbuild.build import sbom
from envbuild.build.image import History, OciImageConfig, write_image
from envbuild.build.layers import Compression
from envbuild.build.ocilayout import write_oci_layout
from envbuild.oci.layout import open_layout
from envbuild.store.core import Store

pytestmark = pytest.mark.registry

Cli = Callable[..., Any]


def _cyclonedx(name: str) -> bytes:
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.bom_ref import BomRef
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.output.json import JsonV1Dot6

    part = Component(type=ComponentType.LIBRARY, name=name, version="1.0", bom_ref=BomRef(name))
    bom = Bom(components=[part])
    data = JsonV1Dot6(bom).output_as_string().encode()
    sbom.validate(data)  # the validator the build's SBOM is checked with
    return data


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    store = Store(tmp_path / "store")
    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc" / "hello").write_text(f"{tmp_path.name}\n")
    layer = layer_from_tree(store, tree, compression=Compression.GZIP)
    image = write_image(store, layers=[layer], config=OciImageConfig(),
                        history=[History(created_by="test")])  # fmt: skip
    out = write_oci_layout(store, image, tmp_path / "oci", ref_name="t")
    sbom.attach(out, _cyclonedx(tmp_path.name), created="2026-01-01T00:00:00Z")
    return out


def _get(registry: Registry, path: str, accept: str) -> dict[str, Any]:
    req = urllib.request.Request(f"{registry.url}{path}", headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def test_push_sends_the_sbom_and_pull_brings_it_back(
    cli: Cli, registry: Registry, layout: Path, tmp_path: Path
) -> None:
    target = registry.ref("sbom/app", "v1")
    pushed = cli("push", layout, target, "--insecure", "--json")
    assert pushed.exit_code == 0, pushed.stderr
    data = pushed.json()
    (artifact,) = data["referrers"]
    image = data["digest"]
    # the registry (no referrers API) lists it under the fallback tag sha256-<hex>
    index = _get(registry, f"/v2/sbom/app/manifests/{image.replace(':', '-')}",
                 "application/vnd.oci.image.index.v1+json")  # fmt: skip
    assert [(m["digest"], m["artifactType"]) for m in index["manifests"]] == [
        (artifact, sbom.MEDIA_TYPE)
    ]
    raw = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false",
                          f"docker://{registry.ref('sbom/app')}@{artifact}"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert json.loads(raw)["subject"]["digest"] == image

    again = cli("push", layout, target, "--insecure", "--json")
    assert again.exit_code == 0, again.stderr
    index = _get(registry, f"/v2/sbom/app/manifests/{image.replace(':', '-')}",
                 "application/vnd.oci.image.index.v1+json")  # fmt: skip
    assert len(index["manifests"]) == 1  # pushed twice, listed once

    dest = tmp_path / "pulled"
    pulled = cli("pull", target, dest, "--insecure", "--json")
    assert pulled.exit_code == 0, pulled.stderr
    assert pulled.json()["referrers"] == [artifact]
    assert sbom.read_attached(dest) == sbom.read_attached(layout)
    assert open_layout(dest).manifest.digest == image  # the image is still the layout's one image


def test_pull_says_pulled_once(cli: Cli, registry: Registry, layout: Path, tmp_path: Path) -> None:
    target = registry.ref("sbom/once", "v1")
    assert cli("push", layout, target, "--insecure").exit_code == 0
    pulled = cli("pull", target, tmp_path / "p", "--insecure")
    assert pulled.exit_code == 0, pulled.stderr
    said = pulled.stdout + pulled.stderr
    assert said.count("pulled ") == 1, said


@pytest.mark.docker
@pytest.mark.slow
def test_an_engine_push_sends_the_sbom_for_the_manifest_the_registry_holds(
    cli: Cli,
    registry: Registry,
    layout: Path,
    tmp_path: Path,
    docker_host: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DOCKER_HOST", docker_host)
    target = registry.ref("sbom/engine", "v1")
    pushed = cli("push", layout, target, "--insecure", "--transport", "docker", "--json")
    assert pushed.exit_code == 0, pushed.stderr
    data = pushed.json()
    image = data["digest"]
    assert image != open_layout(layout).manifest.digest  # the engine recompressed the layer
    (artifact,) = data["referrers"]
    index = _get(registry, f"/v2/sbom/engine/manifests/{image.replace(':', '-')}",
                 "application/vnd.oci.image.index.v1+json")  # fmt: skip
    assert [(m["digest"], m["artifactType"]) for m in index["manifests"]] == [
        (artifact, sbom.MEDIA_TYPE)
    ]
    raw = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false",
                          f"docker://{registry.ref('sbom/engine')}@{artifact}"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert json.loads(raw)["subject"]["digest"] == image

    said = cli("push", layout, target, "--insecure", "--transport", "docker")
    assert said.exit_code == 0, said.stderr
    assert f"sbom: pushed as an OCI 1.1 referrer of {image}: {artifact}" in said.stdout

    dest = tmp_path / "pulled"
    pulled = cli("pull", target, dest, "--insecure", "--json")
    assert pulled.exit_code == 0, pulled.stderr
    assert pulled.json()["referrers"] == [artifact]
    assert sbom.read_attached(dest) == sbom.read_attached(layout)


def test_push_counts_every_blob_it_uploaded_and_json_keeps_stderr_quiet(
    cli: Cli, registry: Registry, layout: Path
) -> None:
    mark = registry.log_mark()
    pushed = cli("push", layout, registry.ref("sbom/count", "v1"), "--insecure", "--json")
    assert pushed.exit_code == 0, pushed.stderr
    data = pushed.json()
    sent = registry.uploads(mark)
    assert len(sent) == 4  # the image's config and layer, the SBOM's config and document
    assert data["uploaded"] == len(sent) and data["skipped"] == 0
    assert sorted(b["digest"] for b in data["blobs"] if b["uploaded"]) == sorted(sent)
    assert pushed.stderr == ""  # no progress under --json (errors would still be there)

    text = cli("push", layout, registry.ref("sbom/count2", "v1"), "--insecure")
    assert text.exit_code == 0, text.stderr
    assert "blobs: 4 uploaded" in text.stdout
    assert "pushing" in text.stderr  # progress where no JSON is asked for
