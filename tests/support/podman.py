"""Podman for the tests, kept off the machine's storage: every call gets ``--root`` and
``--runroot`` under one temporary folder, the vfs driver, cgroupfs and file events (no systemd, no
overlay mounts). Nothing of the machine's own podman storage is read or written.

:func:`private_podman` yields a function that runs ``podman ARGS…`` that way and returns the
completed process; the folder is removed at the end.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from support.dockerd import _unmount_below

#: ``podman run`` options: rootful podman raises RLIMIT_NOFILE and RLIMIT_NPROC to 1048576 and
#: the host's, which a sandboxed test machine refuses (``error setting rlimit type 7``)
RUN_LIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")

Podman = Callable[..., subprocess.CompletedProcess[str]]


@contextmanager
def private_podman() -> Iterator[Podman]:
    root = Path(tempfile.mkdtemp(prefix="envbuild-podman-", dir="/tmp"))
    base = [
        "podman",
        "--root",
        str(root / "root"),
        "--runroot",
        str(root / "run"),
        "--tmpdir",
        str(root / "tmp"),
        "--storage-driver=vfs",
        "--cgroup-manager=cgroupfs",
        "--events-backend=file",
    ]

    def podman(*args: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*base, *map(str, args)], capture_output=True, text=True, check=False, timeout=300
        )

    try:
        yield podman
    finally:
        _unmount_below(root)
        shutil.rmtree(root, ignore_errors=True)
