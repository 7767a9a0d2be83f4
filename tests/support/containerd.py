"""A private containerd for the tests: its own ``--address``, ``--root`` and ``--state`` under
one temporary folder (and no CRI plugin), so ``ctr --address …`` talks to it and nothing of the
machine's own containerd is used or touched.

:func:`private_containerd` starts it, waits until ``ctr version`` answers, yields a function that
runs ``ctr --address SOCK ARGS…``, and stops it at the end.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from support.dockerd import _unmount_below

START_TIMEOUT = 30.0
Ctr = Callable[..., subprocess.CompletedProcess[str]]


@contextmanager
def private_containerd() -> Iterator[Ctr]:
    root = Path(tempfile.mkdtemp(prefix="envbuild-containerd-", dir="/tmp"))
    sock = root / "containerd.sock"
    config = root / "config.toml"
    # no CRI (it would want CNI and a sandbox image), nothing else from /etc/containerd
    config.write_text('version = 2\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\n')
    log_path = root / "containerd.log"
    argv = [
        "containerd",
        "--config",
        str(config),
        "--address",
        str(sock),
        "--root",
        str(root / "root"),
        "--state",
        str(root / "state"),
    ]

    def ctr(*args: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ctr", "--address", str(sock), *map(str, args)],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )

    with log_path.open("wb") as log:
        child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while ctr("version").returncode != 0:
            if child.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"containerd did not start (exit {child.poll()}):\n{tail}")
            time.sleep(0.3)
        yield ctr
    finally:
        child.terminate()
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        _unmount_below(root)
        shutil.rmtree(root, ignore_errors=True)
