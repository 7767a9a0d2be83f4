"""Layer compression as the real clients take it: an image with gzip and one with zstd layers
(a static program, so `docker run` needs no base), pushed by `envbuild push` to the tests'
registry, read back by skopeo (inspect, copy to docker-archive), umoci (unpack, gzip) and the
suite's Docker engine (`docker pull` and `docker run`). What envbuild says about an engine must
be what that engine does: `docker pull` of the zstd image succeeds exactly when envbuild says
the engine reads zstd, and `envbuild load` says so when it does not."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.registry import Registry
from support.treelayer import layer_from_tree

from envbuild.build.dockerarchive import write_docker_archive
from envbuild.build.image import History, OciImageConfig, write_image
from envbuild.build.layers import Compression
from envbuild.build.ocilayout import write_oci_layout
from envbuild.registry.compat import reads_zstd
from envbuild.store.core import Store

pytestmark = [pytest.mark.registry, pytest.mark.docker, pytest.mark.slow]

Cli = Callable[..., Any]
GREETING = "hello from a static envbuild image"


def _need(tool: str) -> None:
    if shutil.which(tool) is None:
        if os.environ.get("CI"):
            pytest.fail(f"{tool} is not installed; CI must have it", pytrace=False)
        pytest.skip(f"{tool} is not installed")


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _need("gcc")
    work = tmp_path_factory.mktemp("static")
    src = work / "hello.c"
    src.write_text(f'#include <stdio.h>\nint main(void){{puts("{GREETING}");return 0;}}\n')
    tree = work / "tree"
    (tree / "bin").mkdir(parents=True)
    subprocess.run(["gcc", "-static", "-O1", "-o", str(tree / "bin" / "hello"), str(src)],
                   check=True, capture_output=True)  # fmt: skip
    return tree


@pytest.fixture(scope="module", params=[Compression.GZIP, Compression.ZSTD], ids=str)
def layout(
    request: pytest.FixtureRequest, program: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    compression: Compression = request.param
    return _image(program, tmp_path_factory.mktemp(f"img-{compression.value}"), compression)


def _image(tree: Path, work: Path, compression: Compression) -> Path:
    """An image of ``tree`` as `envbuild build` leaves one: ``out/oci`` and its docker archive."""
    store = Store(work / "store")
    layer = layer_from_tree(store, tree, compression=compression)
    config = OciImageConfig(cmd=["/bin/hello"], env={"PATH": "/bin"})
    image = write_image(store, layers=[layer], config=config,
                        history=[History(created_by="test: /bin/hello")])  # fmt: skip
    out = work / "out"
    write_oci_layout(store, image, out / "oci", ref_name="hello")
    write_docker_archive(store, image, out / "docker-archive.tar", repo_tags=["envbuild/hello:t"])
    return out


def _compression(layout: Path) -> str:
    blobs = (layout / "oci" / "blobs" / "sha256").iterdir()
    media = [json.loads(p.read_bytes()).get("layers", [{}])[0].get("mediaType", "")
             for p in blobs if p.stat().st_size < 4096 and p.read_bytes()[:1] == b"{"
             and b'"layers"' in p.read_bytes()]  # fmt: skip
    return "zstd" if any(m.endswith("+zstd") for m in media) else "gzip"


def _docker(host: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *argv], capture_output=True, text=True, check=False,
                          env={**os.environ, "DOCKER_HOST": host}, timeout=300)  # fmt: skip


def _engine_version(host: str) -> str:
    done = _docker(host, "version", "--format", "{{.Server.Version}}")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_push_says_which_engines_read_the_layers(cli: Cli, registry: Registry, layout: Path):
    comp = _compression(layout)
    target = registry.ref("compression/hello", comp)
    # the build's output folder, as `envbuild load` takes it (not only its oci/)
    pushed = cli("push", layout, target, "--insecure")
    assert pushed.exit_code == 0, pushed.stderr
    if comp == "zstd":
        assert "layers are zstd: read by containerd >= 1.5, docker >= 23.0" in pushed.stdout
        assert "--compression gzip" in pushed.stdout
        assert "skopeo 1.9.3, umoci 0.4.7" in pushed.stdout  # Debian 12's, named
    else:
        assert "layers are gzip: read by every engine" in pushed.stdout


def test_skopeo_reads_the_pushed_image_and_copies_it_to_a_docker_archive(
    cli: Cli, registry: Registry, layout: Path, tmp_path: Path
):
    _need("skopeo")
    comp = _compression(layout)
    target = registry.ref("compression/hello", comp)
    assert cli("push", layout, target, "--insecure").exit_code == 0
    info = subprocess.run(["skopeo", "inspect", "--tls-verify=false", f"docker://{target}"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert json.loads(info.stdout)["Layers"]
    archive = tmp_path / "a.tar"
    copied = subprocess.run(
        ["skopeo", "copy", "--src-tls-verify=false", f"docker://{target}",
         f"docker-archive:{archive}:envbuild/hello:{comp}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    version = subprocess.run(
        ["skopeo", "--version"], capture_output=True, text=True, check=False
    ).stdout
    says = reads_zstd("skopeo", version.split()[-1]) if comp == "zstd" else True
    assert (copied.returncode == 0) == says, copied.stderr


def test_umoci_unpacks_gzip_layers(layout: Path, tmp_path: Path):
    _need("umoci")
    comp = _compression(layout)
    image = f"{layout / 'oci'}:hello"
    argv = ["umoci", "unpack", "--rootless", "--image", image, str(tmp_path / "bundle")]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    version = subprocess.run(
        ["umoci", "--version"], capture_output=True, text=True, check=False
    ).stdout
    says = reads_zstd("umoci", version.split()[-1]) if comp == "zstd" else True
    assert (done.returncode == 0) == says, done.stderr
    if comp == "gzip":
        assert (tmp_path / "bundle" / "rootfs" / "bin" / "hello").is_file()


def test_docker_pull_works_exactly_when_envbuild_says_the_engine_reads_the_layers(
    cli: Cli, registry: Registry, layout: Path, docker_host: str
):
    comp = _compression(layout)
    target = registry.ref("compression/hello", comp)
    assert cli("push", layout, target, "--insecure").exit_code == 0
    version = _engine_version(docker_host)
    says = reads_zstd("docker", version) if comp == "zstd" else True
    assert says is not None, f"envbuild knows no rule for Docker {version}"
    pulled = _docker(docker_host, "pull", target)
    assert (pulled.returncode == 0) == says, pulled.stdout + pulled.stderr
    if says:
        run = _docker(docker_host, "run", "--rm", "--network", "none", target)
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == GREETING


def test_docker_load_of_zstd_layers_fails_before_docker_23_which_is_why_the_archive_is_plain(
    layout: Path, program: Path, docker_host: str, tmp_path: Path
):
    """A docker archive holding the zstd blobs as they are (not what envbuild writes)."""
    import io
    import tarfile

    from packaging.version import Version

    from envbuild.registry.compat import _release

    if _compression(layout) != "zstd":
        pytest.skip("the gzip image's archive is the plain case")
    # a layer of its own: an engine that has the layer already (pulled) would not unpack it
    tree = tmp_path / "tree"
    shutil.copytree(program, tree)
    (tree / "unique").write_bytes(os.urandom(64))
    layout = _image(tree, tmp_path / "image", Compression.ZSTD)
    oci = layout / "oci"
    index = json.loads((oci / "index.json").read_text())
    manifest = json.loads((oci / "blobs/sha256" / index["manifests"][0]["digest"][7:]).read_text())
    names = [f"blobs/sha256/{d['digest'][7:]}" for d in [manifest["config"], *manifest["layers"]]]
    doc = [{"Config": names[0], "RepoTags": ["envbuild/zstd-archive:t"], "Layers": names[1:]}]
    archive = tmp_path / "zstd.tar"
    with tarfile.open(archive, "w") as tar:
        for name, data in [("manifest.json", json.dumps(doc).encode()),
                           *((n, (oci / n).read_bytes()) for n in names)]:  # fmt: skip
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    version = _engine_version(docker_host)
    done = _docker(docker_host, "load", "-i", str(archive))
    assert (done.returncode == 0) == (Version(_release(version)) >= Version("23")), done.stderr
    # envbuild's own archive of the same image loads everywhere: its layers are uncompressed
    plain = _docker(docker_host, "load", "-i", str(layout / "docker-archive.tar"))
    assert plain.returncode == 0, plain.stderr


def test_load_works_with_any_engine_and_says_what_it_cannot_pull(
    cli: Cli, layout: Path, docker_host: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("DOCKER_HOST", docker_host)
    # the folder has no build manifest (no build made it): nothing in it is loaded, so the
    # archive is loaded from a link outside it
    refused = cli("load", layout / "docker-archive.tar")
    assert refused.exit_code == 2 and "unfinished build" in refused.stderr
    archive = layout.parent / "hello.tar"
    if not archive.exists():
        os.link(layout / "docker-archive.tar", archive)
    loaded = cli("load", archive, "--json")
    assert loaded.exit_code == 0, loaded.stderr
    data = loaded.json()
    version = _engine_version(docker_host)
    assert data["engine_version"] == version
    assert data["reads_zstd"] == reads_zstd("docker", version)
    run = _docker(docker_host, "run", "--rm", "--network", "none", "envbuild/hello:t")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == GREETING
    plain = cli("load", archive)
    assert plain.exit_code == 0, plain.stderr
    if data["reads_zstd"] is False:
        assert f"this engine (Docker {version}) cannot pull images with zstd" in plain.stderr
        assert "--compression gzip" in plain.stderr
    else:
        assert "cannot pull" not in plain.stderr
