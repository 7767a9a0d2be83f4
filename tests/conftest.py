"""Shared fixtures. ``cli`` runs envbuild in-process and returns exit code, stdout and stderr."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.dockerd import docker_host  # noqa: F401
from support.registry import registry, registry_auth, registry_tls  # noqa: F401

from envbuild.cli.main import main

REPO = Path(__file__).resolve().parent.parent

# The tests' own `uv pip install`s copy files out of uv's cache: many tests edit an installed
# file by hand, and an edit in place of a hard link edits the cache (every later install of
# that wheel, in any test, got the edit). envbuild's own uv children do not see this variable
# (proc.uv_env passes only the network and cache ones) and pass --link-mode themselves.
os.environ["UV_LINK_MODE"] = "copy"


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    def run(*args: str | Path) -> CliResult:
        capsys.readouterr()
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return CliResult(code, out, err)

    return run


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """An empty project repository (a folder with .git and specs/) to write specs into."""
    (tmp_path / ".git").mkdir()
    (tmp_path / "specs" / "base").mkdir(parents=True)
    return tmp_path
