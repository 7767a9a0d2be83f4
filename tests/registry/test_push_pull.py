"""push and pull against real loopback registries (Debian's docker-registry), copied by skopeo."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.registry import Registry

pytestmark = pytest.mark.registry

Cli = Callable[..., Any]


def index_digest(layout: Path, tag: str) -> str:
    index = json.loads((layout / "index.json").read_text())
    (entry,) = [
        m
        for m in index["manifests"]
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag
    ]
    return str(entry["digest"])


def layer_digests(layout: Path, tag: str) -> list[str]:
    manifest = json.loads(
        (layout / "blobs" / index_digest(layout, tag).replace(":", "/")).read_bytes()
    )
    return [layer["digest"] for layer in manifest["layers"]]


def test_second_push_uploads_no_blob_again_and_says_so(
    cli: Cli, registry: Registry, make_layout: Callable[..., Path]
) -> None:
    layout = make_layout("app", {"opt/torch.bin": os.urandom(300_000)}, tag="exp1")
    make_layout("app", {"opt/exp2.txt": b"second experiment\n"}, tag="exp2", base=(layout, "exp1"))
    target = registry.ref("team/app", "exp1")

    mark = registry.log_mark()
    first = cli("push", layout, target, "--layout-tag", "exp1", "--insecure", "--json")
    assert first.exit_code == 0, first.stderr
    data = first.json()
    assert data["digest"] == index_digest(layout, "exp1")
    assert data["uploaded"] == 2 and data["skipped"] == 0  # config + one layer
    assert sorted(registry.uploads(mark)) == sorted(b["digest"] for b in data["blobs"])

    mark = registry.log_mark()
    again = cli("push", layout, target, "--layout-tag", "exp1", "--insecure")
    assert again.exit_code == 0, again.stderr
    assert "0 uploaded" in again.stdout
    assert "2 already in the registry, not uploaded again" in again.stdout
    assert registry.uploads(mark) == []  # the registry saw no blob upload

    # A second experiment sharing the first one's layer sends only what is new.
    mark = registry.log_mark()
    second = cli(
        "push", layout, registry.ref("team/app", "exp2"), "--layout-tag", "exp2", "--insecure",
        "--json",
    )  # fmt: skip
    assert second.exit_code == 0, second.stderr
    data = second.json()
    shared = layer_digests(layout, "exp1")[0]
    by_digest = {b["digest"]: b["uploaded"] for b in data["blobs"]}
    assert by_digest[shared] is False
    assert data["uploaded"] == 2 and data["skipped"] == 1  # new config + new layer
    assert shared not in registry.uploads(mark)
    assert len(registry.uploads(mark)) == 2

    # The registry itself names the pushed manifest by the layout's digest.
    status, body = registry.get("/v2/team/app/manifests/exp2")
    assert status == 200
    assert "sha256:" + hashlib.sha256(body).hexdigest() == index_digest(layout, "exp2")


def test_pull_into_a_second_store_verifies_every_blob(
    cli: Cli, registry: Registry, make_layout: Callable[..., Path], tmp_path: Path
) -> None:
    layout = make_layout("src", {"srv/model.bin": os.urandom(50_000), "etc/a": b"a\n"})
    pushed = cli("push", layout, registry.ref("pull/me", "v1"), "--insecure", "--json").json()

    by_tag = cli("pull", registry.ref("pull/me", "v1"), tmp_path / "by-tag", "--insecure", "--json")
    assert by_tag.exit_code == 0, by_tag.stderr
    assert by_tag.json()["digest"] == pushed["digest"]
    assert index_digest(tmp_path / "by-tag", "v1") == pushed["digest"]
    # Every blob on disk is what its name says (checked here independently of envbuild).
    blobs = sorted((tmp_path / "by-tag" / "blobs" / "sha256").iterdir())
    assert len(blobs) == 4  # manifest, config, two layers
    for blob in blobs:
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name

    ref = f"{registry.ref('pull/me')}@{pushed['digest']}"
    by_digest = cli("pull", ref, tmp_path / "by-digest", "--insecure")
    assert by_digest.exit_code == 0, by_digest.stderr
    assert "verified: 3 blobs" in by_digest.stdout
    pulled = json.loads((tmp_path / "by-digest/index.json").read_text())
    assert [m["digest"] for m in pulled["manifests"]] == [pushed["digest"]]
