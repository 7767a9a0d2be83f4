"""Source builds in a builder container made from the image's own lower layers, on a private
Docker engine: F's C extension compiled by the gcc of a Debian base (mmdebstrap), setuptools from a
local index reached through a recording proxy, the built image run by the same engine."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker  # type: ignore[import-untyped]
import pytest
from conftest import CliResult
from support import fwdproxy
from support.gccrootfs import gcc_rootfs  # noqa: F401
from support.project import members, write_project
from support.sdists import FIXTURES, pack_sdist
from support.wheels import make_wheel, ref

from envbuild.build import image
from envbuild.build.layers import Layer
from envbuild.build.manifest import BuiltLayer, stored_layer
from envbuild.engine import DockerEngine
from envbuild.pipeline.planner import load_lock
from envbuild.sourcebuild.container import ContainerBuilder
from envbuild.sourcebuild.inputs import inputs_of
from envbuild.sourcebuild.requests import build_requests
from envbuild.spec import load_spec
from envbuild.store.core import Store

pytestmark = [pytest.mark.docker, pytest.mark.network, pytest.mark.slow]

Build = Callable[..., CliResult]
SITE = "opt/venv/lib/python3.11/site-packages"


@pytest.fixture
def proxy() -> Iterator[fwdproxy.Proxy]:
    with fwdproxy.serve() as p:
        yield p


def project(repo: Path, base: Path | None, index: str, greeting: str = "from a container") -> Path:
    wheels = [ref(make_wheel(repo / "wheels", "helper", "1.0", {"helper.py": "HELP = 1\n"}))]
    sdist = repo / "fixture_cext-1.0.0.tar.gz"
    if not sdist.exists():
        pack_sdist(FIXTURES / "cext", "fixture-cext", "1.0.0", repo)
    extra = (
        '[builds.fixture-cext]\nversion = "1.0.0"\n'
        f'[builds.fixture-cext.env]\nCEXT_GREETING = "{greeting}"\n'
    )
    return write_project(
        repo,
        "boxed",
        wheels,
        extra,
        base=base,
        builds=[("fixture-cext", "1.0.0", sdist)],
        index=index,
        current=True,  # envbuild ci checks it
    )


def layers_holding(store: Store, manifest: dict[str, Any], needles: list[bytes]) -> list[str]:
    """``layer: path`` of every file of envbuild's layers (not the base's, which is the input
    tarball) whose name or content holds one of ``needles``; ``config`` when the config does."""
    found = ["config" for n in needles if n in store.read_blob(manifest["config"])]
    for layer in manifest["layers"]:
        if layer["kind"] == "base":
            continue
        for name, data in members(store, layer["digest"], layer["media_type"]).items():
            if any(n in name.encode() or n in data for n in needles):
                found.append(f"{layer['name']}: {name}")
    return found


def test_a_source_build_runs_in_a_builder_container(
    repo: Path,
    gcc_rootfs: Path,  # noqa: F811
    build_index: str,
    docker_host: str,
    proxy: fwdproxy.Proxy,
    cli: Build,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ca = repo / "host-ca" / "ca-bundle-marker.pem"
    ca.parent.mkdir()
    shutil.copyfile("/etc/ssl/certs/ca-certificates.crt", ca)
    monkeypatch.setenv("DOCKER_HOST", docker_host)
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.setenv("NO_PROXY", "example.invalid")
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    spec = project(repo, gcc_rootfs, build_index)
    store = Store(repo / "store")
    out = repo / "out"
    args = ("build", "--store", store.root, "--output", out, "--builder", "container", spec)
    got = cli(*args)
    assert got.exit_code == 0, got.stderr
    manifest = json.loads((out / "build-manifest.json").read_text())

    # built inside: the image's Python and gcc (bookworm's), the container's identity
    (built,) = manifest["source_builds"]
    assert built["builder"]["mode"] == "container"
    assert built["builder"]["rootfs"].startswith("sha256:")
    assert built["toolchain"]["python"].startswith("3.11.")
    assert built["toolchain"]["compilers"]["gcc"].startswith("12.")
    log = store.read_blob(store.lookup(built["key"]).outputs["log"]).decode()  # type: ignore[union-attr]
    assert "# builder container: image sha256:" in log
    assert "HTTP_PROXY, NO_PROXY, SSL_CERT_FILE (CA bundle mounted read-only)" in log
    assert "+ export CEXT_GREETING=from a container\n" in log  # the flag, as the build saw it

    # the proxy variables reached the container: its uv fetched setuptools through the proxy
    assert any("/simple/setuptools" in u for u in proxy.requests), proxy.requests

    # … and none of the network settings is an input or part of the image
    drv = store.lookup(built["key"])
    assert drv is not None
    inputs = json.dumps(drv.inputs)
    secrets = [proxy.url, "example.invalid", str(ca), ca.name]
    for secret in secrets:
        assert secret not in inputs
        assert secret not in (out / "build-manifest.json").read_text()
    assert layers_holding(store, manifest, [x.encode() for x in secrets]) == []
    loaded = load_spec(spec)
    lock, _ = load_lock(loaded)
    (req,) = build_requests(loaded, lock)
    layers = [stored_layer(store, BuiltLayer.model_validate(x)) for x in manifest["layers"][1:-1]]
    for env in ({}, {"HTTPS_PROXY": "http://elsewhere.invalid:1", "SSL_CERT_FILE": "/nope"}):
        other = ContainerBuilder(
            store,
            layers=[*_base_layers(store, manifest), *layers],
            config=image.OciImageConfig(),
            engine=DockerEngine(docker_host),
            base_env=env,
        )
        assert inputs_of(req, other.probe(cuda=False), other) == drv.inputs

    # the image runs the extension the container compiled
    assert cli("load", out).exit_code == 0
    client = docker.DockerClient(base_url=docker_host)
    try:
        said = client.containers.run(
            "envbuild/boxed:latest",
            ["python", "-c", "import fixture_cext as m; print(m.greeting(), m.add(2, 3))"],
            network_mode="none",
            remove=True,
        )
    finally:
        client.close()
    assert said.decode().strip() == "from a container 5"

    # a wheel built elsewhere is keyed as this container would build it: then reused
    wheel = repo / built["wheel"]
    wheel.write_bytes(store.read_blob(f"sha256:{built['wheel_sha256']}"))
    other = repo / "other-store"
    added = cli(
        "store", "add-wheel", spec, "fixture-cext", wheel, "--builder", "container",
        "--store", other, "--json",
    )  # fmt: skip
    assert added.exit_code == 0, added.stderr
    assert added.json()["key"] == built["key"]
    listed = cli("store", "ls", "--store", other, "--json").json()
    assert [(o["dist"], o["origin"], o["builder"]) for o in listed] == [
        ("fixture-cext", "added", "container")
    ]
    elsewhere = cli(
        "build", "--store", other, "--output", repo / "out2", "--builder", "container",
        "--no-docker-archive", spec,
    )  # fmt: skip
    assert elsewhere.exit_code == 0, elsewhere.stderr
    assert "source-build fixture-cext 1.0.0" in elsewhere.stderr and "reused" in elsewhere.stderr
    assert elsewhere.stdout.strip() == manifest["image"]

    # a no-op rebuild needs no engine: the toolchain probe and the wheel come from the store
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    again = cli(*args)
    assert again.exit_code == 0, again.stderr
    assert "(0 rebuilt)" in again.stderr and "reused" in again.stderr
    assert again.stdout.strip() == manifest["image"]

    # envbuild ci takes the same options: the container-built wheel is found by its key (the
    # host builder's key differs, and would compile again for another image)
    ci = cli("ci", "--store", store.root, "--builder", "container", "--no-docker-archive",
             "--json", spec)  # fmt: skip
    assert ci.exit_code == 0, ci.stderr
    (outcome,) = ci.json()["specs"]
    assert outcome["image"] == manifest["image"] and outcome["layers_new"] == 0
    assert (repo / "images" / "boxed" / "build-manifest.json").is_file()
    assert not (repo / "images" / "boxed" / "docker-archive.tar").exists()


def _base_layers(store: Store, manifest: dict[str, Any]) -> list[Layer]:
    base = store.lookup(manifest["base"]["key"])
    assert base is not None
    return [Layer.model_validate(x) for x in base.meta["layers"]]


def test_a_builder_image_without_a_compiler_is_refused(
    repo: Path, build_index: str, docker_host: str, cli: Build, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tiny rootfs has no shell, no Python, no compiler: refused, and nothing is stored."""
    monkeypatch.setenv("DOCKER_HOST", docker_host)
    spec = project(repo, None, build_index)
    got = cli("build", "--store", repo / "store", "--builder", "container", spec)
    assert got.exit_code == 3
    assert "sources: the builder image cannot start a container: " in got.stderr
    assert "/bin/sh" in got.stderr and "hint: a builder image needs /bin/sh" in got.stderr
    store = Store(repo / "store")
    kinds = {store.lookup(k).kind for k in store.derivations()}  # type: ignore[union-attr]
    assert "source-build" not in kinds and "builder-probe" not in kinds
