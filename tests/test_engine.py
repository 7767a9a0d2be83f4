"""The container engine interface: the engine named at the command line, an engine that does not
answer, and every operation against a real (private) dockerd."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from envbuild.cli.engineopts import docker_engine
from envbuild.engine import DEFAULT_HOST, DockerEngine, Mount, RunRequest
from envbuild.errors import ContainerStartFailed, EngineUnreachable

#: A static program: prints $GREETING, its arguments and the file /in/data, exits 3.
SAY_C = r"""
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    char buf[64] = {0};
    FILE *f = fopen("/in/data", "r");
    if (f) { fread(buf, 1, sizeof buf - 1, f); fclose(f); }
    printf("%s %s %s\n", getenv("GREETING"), argc > 1 ? argv[1] : "-", buf);
    return 3;
}
"""


def test_the_command_line_names_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert docker_engine().host == DEFAULT_HOST
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/other.sock")
    assert docker_engine().host == "unix:///run/other.sock"
    assert docker_engine("tcp://10.0.0.1:2375").host == "tcp://10.0.0.1:2375"


def test_an_engine_that_does_not_answer(tmp_path: Path) -> None:
    engine = DockerEngine(f"unix://{tmp_path}/no.sock")
    assert engine.available() is False
    with pytest.raises(EngineUnreachable) as caught:
        engine.version()
    assert caught.value.host == engine.host
    assert caught.value.message.startswith(f"no Docker engine answers at {engine.host}: ")
    assert caught.value.exit_code == 3


def _archive(folder: Path, binary: Path, tag: str) -> Path:
    """A ``docker load`` archive of one layer holding ``/say``."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        tar.add(binary, arcname="say")
    layer_bytes = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": ["/say"]},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [tag], "Layers": ["layer.tar"]}])
    path = folder / "image.tar"
    with tarfile.open(path, "w") as tar:
        for name, data in (
            (config_name, config),
            ("layer.tar", layer_bytes),
            ("manifest.json", manifest.encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def say_archive(tmp_path: Path) -> Iterator[Path]:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc builds the container's program")
    (tmp_path / "say.c").write_text(SAY_C)
    binary = tmp_path / "say"
    subprocess.run([gcc, "-static", "-O2", "-o", binary, tmp_path / "say.c"], check=True)
    yield _archive(tmp_path, binary, "envbuild-test/say:1")


@pytest.mark.docker
@pytest.mark.slow
def test_every_operation_against_a_real_engine(
    docker_host: str, say_archive: Path, tmp_path: Path
) -> None:
    engine = DockerEngine(docker_host)
    assert engine.available() and engine.version()
    loaded = engine.load(say_archive)
    assert loaded.id.startswith("sha256:") and loaded.tags == ["envbuild-test/say:1"]
    found = engine.inspect_image("envbuild-test/say:1")
    assert found is not None and found.id == loaded.id
    assert engine.inspect_image("envbuild-test/none:1") is None

    (tmp_path / "data").write_text("mounted")
    seen: list[str] = []
    done = engine.run(
        RunRequest(
            loaded.id,
            command=["hello"],
            environment={"GREETING": "hi"},
            mounts=[Mount(tmp_path / "data", "/in/data")],
            labels={"dev.envbuild.test": "1"},
        ),
        on_output=seen.append,
    )
    assert (done.exit_code, done.output.strip()) == (3, "hi hello mounted")
    assert "".join(seen) == done.output
    assert all(c.name for c in engine.containers())  # the throwaway container is gone
    import docker  # type: ignore[import-untyped]

    client = docker.DockerClient(base_url=docker_host, timeout=30)
    try:
        left = client.containers.list(all=True, filters={"label": "dev.envbuild.test"})
    finally:
        client.close()
    assert left == []

    with pytest.raises(ContainerStartFailed) as caught:
        engine.run(RunRequest(loaded.id, command=[], entrypoint=["/no/such/program"]))
    assert "/no/such/program" in caught.value.detail

    saved = tmp_path / "saved.tar"
    with saved.open("wb") as out:
        engine.save(loaded.id, out)
    with tarfile.open(saved) as tar:
        assert "manifest.json" in tar.getnames()
