"""push and pull through a Docker engine (the docker SDK), for machines without skopeo: a
private dockerd (vfs) and the loopback registries."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.registry import PASSWORD, Registry

pytestmark = [pytest.mark.registry, pytest.mark.docker, pytest.mark.slow]

Cli = Callable[..., Any]


@pytest.fixture
def engine(docker_host: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("DOCKER_HOST", docker_host)
    return docker_host


def config_of(layout: Path) -> tuple[str, dict[str, Any]]:
    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads(
        (layout / "blobs" / index["manifests"][0]["digest"].replace(":", "/")).read_bytes()
    )
    digest = manifest["config"]["digest"]
    return digest, json.loads((layout / "blobs" / digest.replace(":", "/")).read_bytes())


def test_engine_push_skips_what_the_registry_has_and_pull_verifies(
    cli: Cli, engine: str, registry: Registry, make_layout: Callable[..., Path], tmp_path: Path
) -> None:
    layout = make_layout("eng", {"opt/big.bin": os.urandom(200_000), "etc/x": b"x\n"})
    target = registry.ref("engine/app", "v1")
    first = cli("push", layout, target, "--insecure", "--transport", "docker", "--json")
    assert first.exit_code == 0, first.stderr
    data = first.json()
    assert data["transport"] == "docker" and data["uploaded"] == 3 and data["skipped"] == 0

    mark = registry.log_mark()
    again = cli("push", layout, target, "--insecure", "--transport", "docker")
    assert again.exit_code == 0, again.stderr
    assert "0 uploaded" in again.stdout and "3 already in the registry" in again.stdout
    assert registry.uploads(mark) == []

    dest = tmp_path / "pulled"
    pulled = cli("pull", target, dest, "--insecure", "--transport", "docker", "--json")
    assert pulled.exit_code == 0, pulled.stderr
    assert pulled.json()["digest"] == data["digest"]
    config_digest, config = config_of(dest)
    assert config_digest == config_of(layout)[0]  # the engine kept the image config
    index = json.loads((dest / "index.json").read_text())
    manifest = json.loads(
        (dest / "blobs" / index["manifests"][0]["digest"].replace(":", "/")).read_bytes()
    )
    layers = [layer["digest"] for layer in manifest["layers"]]
    assert layers == config["rootfs"]["diff_ids"]
    for digest in layers:
        blob = dest / "blobs" / digest.replace(":", "/")
        assert "sha256:" + hashlib.sha256(blob.read_bytes()).hexdigest() == digest


def test_engine_refuses_a_corrupt_registry_blob(
    cli: Cli, engine: str, registry: Registry, make_layout: Callable[..., Path], tmp_path: Path
) -> None:
    layout = make_layout("engbad", {"data/unique.bin": os.urandom(30_000)})
    target = registry.ref("engine/corrupt", "v1")
    pushed = cli("push", layout, target, "--insecure", "--json")  # skopeo: the layout's bytes
    assert pushed.exit_code == 0, pushed.stderr
    layer = next(b for b in pushed.json()["blobs"] if "layer" in b["media_type"])
    blob = registry.blob_file(layer["digest"])
    data = bytearray(blob.read_bytes())
    data[200] ^= 0xFF
    blob.write_bytes(bytes(data))
    result = cli("pull", target, tmp_path / "p", "--insecure", "--transport", "docker")
    assert result.exit_code == 3, result.stderr
    assert "does not match its digest" in result.stderr
    assert not (tmp_path / "p").exists()


def test_engine_with_wrong_credentials(
    cli: Cli,
    engine: str,
    registry_auth: Registry,
    make_layout: Callable[..., Path],
    docker_config: Path,
) -> None:
    layout = make_layout("engauth", {"f": b"auth\n"})
    target = registry_auth.ref("engine/private", "v1")
    registry_auth.write_docker_config(docker_config, password="wrong-" + PASSWORD)
    bad = cli("push", layout, target, "--insecure", "--transport", "docker")
    assert bad.exit_code == 3
    assert "refused the credentials" in bad.stderr
    assert PASSWORD not in bad.stderr + bad.stdout
    registry_auth.write_docker_config(docker_config)
    good = cli("push", layout, target, "--insecure", "--transport", "docker")
    assert good.exit_code == 0, good.stderr
