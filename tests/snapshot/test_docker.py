"""Docker through the real engine (a private dockerd): a running container and its image."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from envbuild.engine import (
    Auth,
    ContainerEngine,
    ContainerInfo,
    DockerEngine,
    Finished,
    ImageInfo,
    LoadedImage,
    RunRequest,
)
from envbuild.errors import EngineError
from envbuild.snapshot.docker import read_docker
from envbuild.snapshot.redact import Redactor

#: A static program that only waits: no libc, no shell, so the image is one file.
PAUSE_C = """
void _start(void) {
    for (;;) __asm__ volatile ("mov $34, %%eax\\n syscall" ::: "rax", "rcx", "r11", "memory");
}
"""


@pytest.fixture
def running_container(docker_host: str, tmp_path: Path) -> Iterator[str]:
    import docker

    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc builds the container's program")
    (tmp_path / "pause.c").write_text(PAUSE_C)
    subprocess.run(
        [gcc, "-nostdlib", "-static", "-O2", "-o", tmp_path / "pause", tmp_path / "pause.c"],
        check=True,
    )
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        tar.add(tmp_path / "pause", arcname="pause")
    client = docker.DockerClient(base_url=docker_host, timeout=30)
    try:
        client.api.import_image_from_data(archive.getvalue(), repository="envbuild-pause", tag="1")
        container = client.containers.run(
            "envbuild-pause:1", ["/pause"], name="vllm-test", detach=True, network_mode="none"
        )
        try:
            yield container.id
        finally:
            container.remove(force=True)
            client.images.remove("envbuild-pause:1", force=True)
    finally:
        client.close()


@pytest.mark.docker
@pytest.mark.slow
def test_running_containers_and_their_images(running_container: str, docker_host: str) -> None:
    section = read_docker(Redactor(), DockerEngine(docker_host))
    assert section.available and section.server_version
    [c] = section.containers
    assert (c.name, c.id, c.image, c.status) == (
        "vllm-test",
        running_container,
        "envbuild-pause:1",
        "running",
    )
    assert c.image_id.startswith("sha256:")


class FakeEngine(ContainerEngine):
    """An engine with two containers; the image of one cannot be inspected."""

    host = "fake://"

    def version(self) -> str | None:
        return "27.0.0"

    def containers(self) -> list[ContainerInfo]:
        return [
            ContainerInfo("z-web", "id2", "web:1", "sha256:bb", "running"),
            ContainerInfo("a-vllm", "id1", "vllm:1", "sha256:aa", "running"),
        ]

    def inspect_image(self, ref: str) -> ImageInfo | None:
        if ref == "sha256:bb":
            raise EngineError("inspecting it failed", host=self.host)
        return ImageInfo(ref, ["reg/vllm@sha256:2", "reg/vllm@sha256:1"])

    def load(self, archive: Path) -> LoadedImage:
        raise NotImplementedError

    def run(
        self, request: RunRequest, *, on_output: Callable[[str], None] | None = None
    ) -> Finished:
        raise NotImplementedError

    def push(self, name: str, tag: str | None, auth: Auth | None) -> Iterator[dict[str, Any]]:
        raise NotImplementedError

    def pull(self, name: str, tag: str | None, auth: Auth | None) -> Iterator[dict[str, Any]]:
        raise NotImplementedError

    def save(self, ref: str, out: IO[bytes]) -> None:
        raise NotImplementedError


def test_the_section_from_an_engine_sorted_and_without_what_it_cannot_inspect() -> None:
    section = read_docker(Redactor(), FakeEngine())
    assert section.available and section.server_version == "27.0.0"
    assert [(c.name, c.repo_digests) for c in section.containers] == [
        ("a-vllm", ["reg/vllm@sha256:1", "reg/vllm@sha256:2"]),
        ("z-web", []),
    ]


def test_verify_asks_the_engine_the_snapshot_asked(
    cli: Callable[..., Any], docker_host: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`snapshot` and `verify` read one engine setting ($DOCKER_HOST, cli/engineopts.py): right
    after a snapshot there is no drift, not "engine: → not available"."""
    monkeypatch.setenv("DOCKER_HOST", docker_host)
    manifest = tmp_path / "snap.json"
    r = cli("snapshot", "--no-models", "--no-systemd", "-o", manifest)
    assert r.exit_code == 0, r.stderr
    assert '"available": true' in manifest.read_text()
    r = cli("verify", manifest)
    assert r.exit_code == 0, r.stdout
    assert "no drift" in r.stdout
