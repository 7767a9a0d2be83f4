"""Fixtures for the registry tests: OCI layouts made with umoci, and a private Docker config."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest


def umoci(*args: str | Path) -> None:
    subprocess.run(["umoci", *map(str, args)], check=True, capture_output=True)


@pytest.fixture
def make_layout(tmp_path: Path) -> Callable[..., Path]:
    """``make_layout(name, {"path": bytes, ...}, tag="v1", base=None)``: an OCI layout (built by
    umoci) with one layer per file. With ``base=(layout, tag)`` the new tag starts from that
    image, in the same layout, so the two share the base's layers."""
    if shutil.which("umoci") is None:
        if os.environ.get("CI"):
            pytest.fail("umoci is not installed; CI must have it", pytrace=False)
        pytest.skip("umoci is not installed (apt-get install umoci)")

    def make(
        name: str,
        files: dict[str, bytes],
        tag: str = "v1",
        base: tuple[Path, str] | None = None,
    ) -> Path:
        if base is None:
            layout = tmp_path / name
            umoci("init", "--layout", layout)
            umoci("new", "--image", f"{layout}:{tag}")
        else:
            layout = base[0]
            umoci("tag", "--image", f"{layout}:{base[1]}", tag)
        src = tmp_path / f"{name}-{tag}-src"
        for i, (path, data) in enumerate(sorted(files.items())):
            f = src / str(i) / Path(path).name
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(data)
            umoci("insert", "--image", f"{layout}:{tag}", f, "/" + path.lstrip("/"))
        umoci("gc", "--layout", layout)
        return layout

    return make


@pytest.fixture(autouse=True)
def docker_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Credentials come only from a private ``$DOCKER_CONFIG`` (empty unless a test writes it)."""
    folder = tmp_path / "docker-config"
    folder.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(folder))
    monkeypatch.delenv("REGISTRY_AUTH_FILE", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    return folder
