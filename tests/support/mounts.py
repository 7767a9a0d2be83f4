"""Real mounts for tests (bind mounts, small tmpfs): made with mount(8), undone after the test
whatever it left. Tests run as root here and in CI; elsewhere they skip, except in CI, where a
mount that cannot be made fails."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def mounted_under(path: Path) -> list[str]:
    """The mount points at or beneath ``path`` (read here, not by the code under test)."""
    top = os.path.realpath(path)
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        points = [line.split(" ")[4] for line in f]
    return sorted(p for p in points if p == top or p.startswith(top + "/"))


def _mounted(point: Path) -> bool:
    return os.path.realpath(point) in mounted_under(point)


class Mounts:
    """``bind(src, dst)`` and ``tmpfs(dst, size)``; every mount made is detached at the end."""

    def __init__(self) -> None:
        self.made: list[Path] = []
        self.watched: list[Path] = []

    def _mount(self, argv: list[str], point: Path) -> None:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            _cannot(f"{' '.join(argv)}: {done.stderr.strip()}")
        self.made.append(point)

    def bind(self, src: Path, dst: Path) -> None:
        self._mount(["mount", "--bind", str(src), str(dst)], dst)

    def tmpfs(self, dst: Path, size: str = "1m") -> None:
        options = f"size={size},mode=0755"
        self._mount(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(dst)], dst)

    def also_under(self, path: Path) -> None:
        """Undo too what a program under test mounts beneath ``path`` (and fails to undo)."""
        self.watched.append(path)

    def undo(self) -> None:
        for top in self.watched:
            self.made.extend(Path(p) for p in mounted_under(top))
        for point in reversed(self.made):
            while _mounted(point):
                if subprocess.run(["umount", "-l", str(point)], check=False).returncode != 0:
                    break


def _cannot(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"cannot mount, which CI must be able to: {why}", pytrace=False)
    pytest.skip(f"cannot mount here ({why}): these tests need root and mount(8)")


@pytest.fixture
def mounts() -> Iterator[Mounts]:
    if os.geteuid() != 0:
        _cannot("not root")
    made = Mounts()
    try:
        yield made
    finally:
        made.undo()
