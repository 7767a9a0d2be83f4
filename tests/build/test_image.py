"""Images: OCI layouts that skopeo and umoci accept; docker archives that an engine runs and
that podman and containerd load under their name."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.containerd import private_containerd
from support.debianbase import DebianRootfs, need
from support.podman import RUN_LIMITS, private_podman
from support.treelayer import layer_from_tree

from envbuild.build.dockerarchive import DOCKER_ARCHIVE, write_docker_archive
from envbuild.build.image import History, Image, OciImageConfig, epoch_time, write_image
from envbuild.build.layers import Compression, Layer
from envbuild.build.ocilayout import write_oci_layout
from envbuild.oci.layout import open_layout
from envbuild.store.core import Store

HELLO = """#!/usr/bin/python3
import sys
print("hello from", sys.argv[0], "python", sys.version_info[:2])
"""


def app_tree(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    script = root / "bin" / "hello"
    script.write_text(HELLO)
    script.chmod(0o755)
    (root / "share").mkdir()
    (root / "share" / "data.txt").write_text("some data\n")
    return root


def build_image(
    store: Store,
    base_layers: list[Layer],
    tree: Path,
    compression: Compression,
    created: str | None = None,
) -> Image:
    app = layer_from_tree(store, tree, prefix="opt/app", compression=compression)
    config = OciImageConfig(
        env={"PATH": "/opt/app/bin:/usr/bin:/bin", "APP_HOME": "/opt/app"},
        cmd=["hello"],
        workdir="/opt/app",
        labels={"org.envbuild.spec": "test"},
    )
    history = [History(created_by=f"base {i}") for i in range(len(base_layers))]
    return write_image(
        store,
        layers=[*base_layers, app],
        config=config,
        history=[*history, History(created_by="envbuild: app")],
        created=created,
    )


def skopeo_inspect(*args: str) -> dict:
    done = subprocess.run(["skopeo", "inspect", *args], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_a_tiny_image_is_canonical_and_deterministic(tmp_path):
    tree = app_tree(tmp_path / "tree")
    a = build_image(Store(tmp_path / "s1"), [], tree, Compression.GZIP)
    b = build_image(Store(tmp_path / "s2"), [], tree, Compression.GZIP)
    assert a == b
    store = Store(tmp_path / "s1")
    config_bytes = store.read_blob(a.config_digest)
    config = json.loads(config_bytes)
    assert config_bytes == json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    assert "created" not in config  # no SOURCE_DATE_EPOCH: no time at all
    assert config["config"]["Env"] == ["APP_HOME=/opt/app", "PATH=/opt/app/bin:/usr/bin:/bin"]
    assert config["rootfs"]["diff_ids"] == [x.diff_id for x in a.layers]
    manifest = json.loads(store.read_blob(a.manifest_digest))
    assert manifest["config"]["digest"] == a.config_digest
    assert [x["digest"] for x in manifest["layers"]] == [x.digest for x in a.layers]
    out1 = write_oci_layout(store, a, tmp_path / "o1", ref_name="tiny")
    out2 = write_oci_layout(Store(tmp_path / "s2"), b, tmp_path / "o2", ref_name="tiny")
    for name in ("index.json", "oci-layout"):
        assert (out1 / name).read_bytes() == (out2 / name).read_bytes()
    for blob in (out1 / "blobs" / "sha256").iterdir():
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name
    layout = open_layout(out1, "tiny")
    assert layout.manifest.digest == a.manifest_digest
    assert layout.config.digest == a.config_digest


def test_source_date_epoch_dates_the_config(tmp_path):
    created = epoch_time(1_700_000_000)
    image = build_image(
        Store(tmp_path / "s"), [], app_tree(tmp_path / "t"), Compression.GZIP, created
    )
    config = json.loads(Store(tmp_path / "s").read_blob(image.config_digest))
    assert config["created"] == "2023-11-14T22:13:20Z"
    assert {h["created"] for h in config["history"]} == {"2023-11-14T22:13:20Z"}


def test_a_build_dates_its_image_by_the_lock_cutoff_unless_source_date_epoch(tmp_path, monkeypatch):
    from datetime import UTC, datetime

    from envbuild.build.image import created_for

    cutoff = datetime(2026, 1, 1, tzinfo=UTC)
    assert created_for(cutoff, epoch_time(None)) == "2026-01-01T00:00:00Z"
    store = Store(tmp_path / "s")
    app = layer_from_tree(store, app_tree(tmp_path / "t"), prefix="opt/app")
    image = write_image(
        store,
        layers=[app],
        config=OciImageConfig(),
        history=[History(created_by="x")],
        created=created_for(cutoff, None),
    )
    config = json.loads(store.read_blob(image.config_digest))
    assert config["created"] == "2026-01-01T00:00:00Z"
    assert config["history"][0]["created"] == "2026-01-01T00:00:00Z"
    assert created_for(cutoff, epoch_time(1_700_000_000)) == "2023-11-14T22:13:20Z"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.from_regex(r"[a-z][a-z0-9-]{0,30}==[0-9]{1,3}(\.[0-9]{1,3}){0,3}", fullmatch=True),
             max_size=40, unique=True),
    st.integers(min_value=40, max_value=300),
)  # fmt: skip
def test_layer_history_names_what_fits_and_counts_the_rest(dists, limit):
    from envbuild.build.image import layer_history

    text = layer_history("envbuild group group-01", dists, limit=limit)
    if not dists:
        assert text == "envbuild group group-01"
        return
    head, _, named = text.partition(": ")
    assert head == "envbuild group group-01"
    shown, more = named, 0
    if named.endswith(" more)"):
        shown, _, count = named.rpartition(" (+")
        more = int(count.removesuffix(" more)"))
        assert more >= 1
    names = shown.split(", ")
    assert names == dists[: len(names)]  # in order, whole names only, the first always
    assert len(names) + more == len(dists)
    assert len(text) <= limit or len(names) == 1


def test_skopeo_and_umoci_accept_the_layout(tmp_path, debian_rootfs: DebianRootfs):
    need("skopeo")
    need("umoci")
    store = debian_rootfs.store
    # umoci 0.4 reads gzip layers only: re-pack the base as gzip for this check
    image = build_image(
        store, debian_rootfs.base.layers, app_tree(tmp_path / "t"), Compression.GZIP
    )
    out = write_oci_layout(store, image, tmp_path / "layout", ref_name="envbuild-test")
    info = skopeo_inspect(f"oci:{out}:envbuild-test")
    assert info["Digest"] == image.manifest_digest
    assert info["Layers"] == [x.digest for x in image.layers]
    assert info["Architecture"] == "amd64"
    assert info["Labels"] == {"org.envbuild.spec": "test"}
    raw = subprocess.run(
        ["skopeo", "inspect", "--raw", f"oci:{out}:envbuild-test"],
        capture_output=True,
        check=True,
    ).stdout
    assert f"sha256:{hashlib.sha256(raw).hexdigest()}" == image.manifest_digest

    gz = build_image(Store(tmp_path / "gz"), [], app_tree(tmp_path / "t2"), Compression.GZIP)
    gz_out = write_oci_layout(Store(tmp_path / "gz"), gz, tmp_path / "gz-layout", ref_name="t")
    bundle = tmp_path / "bundle"
    subprocess.run(
        ["umoci", "unpack", "--image", f"{gz_out}:t", str(bundle)], capture_output=True, check=True
    )
    rootfs = bundle / "rootfs"
    assert (rootfs / "opt/app/bin/hello").read_text() == HELLO
    assert os.access(rootfs / "opt/app/bin/hello", os.X_OK)
    assert (rootfs / "opt/app/share/data.txt").read_text() == "some data\n"
    runtime = json.loads((bundle / "config.json").read_text())
    assert runtime["process"]["cwd"] == "/opt/app"
    assert "APP_HOME=/opt/app" in runtime["process"]["env"]


@pytest.mark.docker
@pytest.mark.slow
def test_docker_loads_and_runs_the_image(tmp_path, debian_rootfs: DebianRootfs, docker_host, cli):
    store = debian_rootfs.store
    image = build_image(
        store, debian_rootfs.base.layers, app_tree(tmp_path / "t"), Compression.ZSTD
    )
    out = write_oci_layout(store, image, tmp_path / "img", ref_name="envbuild-test")
    inside = write_docker_archive(
        store, image, out / DOCKER_ARCHIVE, repo_tags=["envbuild/test:v1"]
    )
    assert inside.config_digest == image.config_digest
    assert [x.digest for x in inside.layers] == [x.diff_id for x in image.layers]
    again = tmp_path / "again.tar"
    write_docker_archive(store, image, again, repo_tags=["envbuild/test:v1"])
    assert again.read_bytes() == (out / DOCKER_ARCHIVE).read_bytes()

    env = {"DOCKER_HOST": docker_host}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        result = cli("load", out, "--json")
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert result.exit_code == 0, result.stderr
    loaded = result.json()
    assert loaded["image_id"] == image.config_digest  # Docker's image ID is the config digest
    assert loaded["tags"] == ["envbuild/test:v1"]
    run = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "envbuild/test:v1"],
        capture_output=True,
        text=True,
        env=dict(os.environ, DOCKER_HOST=docker_host),
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "hello from /opt/app/bin/hello python (3, 11)"


def _archive(tmp_path: Path, debian_rootfs: DebianRootfs) -> tuple[Image, Path]:
    store = debian_rootfs.store
    image = build_image(
        store, debian_rootfs.base.layers, app_tree(tmp_path / "t"), Compression.ZSTD
    )
    archive = tmp_path / DOCKER_ARCHIVE
    inside = write_docker_archive(store, image, archive, repo_tags=["envbuild/test:v1"])
    again = tmp_path / "again.tar"
    write_docker_archive(store, image, again, repo_tags=["envbuild/test:v1"])
    assert again.read_bytes() == archive.read_bytes()
    return inside, archive


@pytest.mark.slow
def test_podman_loads_the_archive_by_its_name_and_runs_it(tmp_path, debian_rootfs: DebianRootfs):
    need("podman")
    image, archive = _archive(tmp_path, debian_rootfs)
    with private_podman() as podman:
        loaded = podman("load", "-i", archive)
        assert loaded.returncode == 0, loaded.stderr
        assert "Loaded image: docker.io/envbuild/test:v1" in loaded.stdout, loaded.stdout
        listed = podman("images", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}")
        assert listed.stdout.split() == [
            "docker.io/envbuild/test:v1",
            image.config_digest.removeprefix("sha256:")[:12],
        ]
        run = podman("run", "--rm", *RUN_LIMITS, "--network", "none", "envbuild/test:v1")
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == "hello from /opt/app/bin/hello python (3, 11)"
        run = podman("run", "--rm", *RUN_LIMITS, "--network", "none", "envbuild/test:v1", "true")
        assert run.returncode == 0, run.stderr


@pytest.mark.slow
def test_ctr_imports_the_archive_by_its_name(tmp_path, debian_rootfs: DebianRootfs):
    need("containerd")
    need("ctr", "containerd")
    image, archive = _archive(tmp_path, debian_rootfs)
    with private_containerd() as ctr:
        imported = ctr("images", "import", archive)
        assert imported.returncode == 0, imported.stderr
        listed = ctr("images", "ls", "-q")
        assert listed.stdout.split() == ["docker.io/envbuild/test:v1"], imported.stdout
        check = ctr("images", "check")
        assert "docker.io/envbuild/test:v1" in check.stdout
        assert "complete" in check.stdout, check.stdout
        rows = ctr("images", "ls").stdout.splitlines()
        assert any(image.manifest_digest in row for row in rows[1:]), rows


def test_load_without_an_engine_is_a_clear_error(tmp_path, cli):
    store = Store(tmp_path / "s")
    image = build_image(store, [], app_tree(tmp_path / "t"), Compression.GZIP)
    out = write_oci_layout(store, image, tmp_path / "img", ref_name="x")
    write_docker_archive(store, image, out / DOCKER_ARCHIVE, repo_tags=["x:1"])
    result = cli("load", out, "--host", f"unix://{tmp_path}/nothing.sock")
    assert result.exit_code == 3
    assert "no Docker engine answers" in result.stderr
    missing = cli("load", tmp_path / "t")
    assert missing.exit_code == 2
    assert DOCKER_ARCHIVE in missing.stderr
