"""Docker through the real engine (a private dockerd): a running container and its image."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

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
def test_running_containers_and_their_images(
    running_container: str, docker_host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", docker_host)
    section = read_docker(Redactor())
    assert section.available and section.server_version
    [c] = section.containers
    assert (c.name, c.id, c.image, c.status) == (
        "vllm-test",
        running_container,
        "envbuild-pause:1",
        "running",
    )
    assert c.image_id.startswith("sha256:")
