"""A private Docker engine for the tests: ``dockerd`` on its own socket, data root and exec root.

The session fixture ``docker_host`` starts ``dockerd --storage-driver=vfs --iptables=false
--bridge=none`` with everything under one temporary folder, waits until it answers, yields its
``DOCKER_HOST`` (``unix:///…/docker.sock``) and stops it at the end of the session. Nothing of the
machine's own engine is used or touched.

When ``dockerd`` is missing the fixture skips with a reason, except in CI (``$CI`` set), where a
missing engine is a broken test machine and fails the run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0


def _answers(host: str) -> bool:
    import docker

    try:
        client = docker.DockerClient(base_url=host, timeout=5)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


@contextmanager
def private_dockerd(folder: Path | None = None) -> Iterator[str]:
    """Run a private dockerd until the block ends; yields its DOCKER_HOST."""
    binary = shutil.which("dockerd")
    if binary is None:
        raise FileNotFoundError("dockerd")
    # a short path: a unix socket's name must fit in 108 bytes
    root = Path(folder or tempfile.mkdtemp(prefix="envbuild-dockerd-", dir="/tmp"))
    sock = root / "docker.sock"
    host = f"unix://{sock}"
    log_path = root / "dockerd.log"
    argv = [
        binary,
        "--storage-driver=vfs",
        "--iptables=false",
        "--ip-masq=false",
        "--bridge=none",
        "--host",
        host,
        "--data-root",
        str(root / "data"),
        "--exec-root",
        str(root / "exec"),
        "--pidfile",
        str(root / "docker.pid"),
    ]
    with log_path.open("wb") as log:
        child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not _answers(host):
            if child.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"dockerd did not start (exit {child.poll()}):\n{tail}")
            time.sleep(0.3)
        yield host
    finally:
        child.terminate()
        try:
            child.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        _unmount_below(root)  # dockerd leaves exec/netns/default mounted: rmtree cannot remove it
        shutil.rmtree(root, ignore_errors=True)


def _unmount_below(root: Path) -> None:
    """Unmount what is mounted at or below ``root``, deepest first (best effort)."""
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return
    prefix = str(root.resolve())
    points = [line.split()[1] for line in lines if len(line.split()) > 1]
    below = [p for p in points if p == prefix or p.startswith(prefix + "/")]
    for point in sorted(below, key=len, reverse=True):
        subprocess.run(["umount", point], check=False, capture_output=True)


@pytest.fixture(scope="session")
def docker_host() -> Iterator[str]:
    """DOCKER_HOST of a private engine started for this test session."""
    if shutil.which("dockerd") is None:
        if os.environ.get("CI"):
            pytest.fail("dockerd is not installed; CI must have docker.io", pytrace=False)
        pytest.skip("dockerd is not installed (apt-get install docker.io)")
    with private_dockerd() as host:
        yield host
