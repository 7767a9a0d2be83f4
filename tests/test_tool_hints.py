"""A failed tool's hint follows from the failure (its exit status, its last lines), never from
its name (issue 24: a mmdebstrap that ran and failed was told "install it (apt-get install
mmdebstrap)"). Real commands: the real mmdebstrap against a mirror that is not there (it fails
in seconds), a PATH without it, and small shell commands that fail as tools do."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import CliResult
from support.mmdebstrap import need_mmdebstrap

from envbuild.errors import ToolFailed, ToolNotFound
from envbuild.proc import core as proc

SPEC = """\
name = "s"
[base]
kind = "debian"
suite = "bookworm"
mirror = "file:///nonexistent"
packages = ["python3-minimal"]
[python]
version = "3.11"
[resolution]
exclude_newer = 2026-01-01T00:00:00Z
"""
INSTALL = "install it (Debian: apt-get install mmdebstrap)"


@pytest.fixture
def spec(repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(repo)
    monkeypatch.setenv("ENVBUILD_SCRATCH", str(tmp_path / "scratch"))
    monkeypatch.setenv("ENVBUILD_STORE", str(tmp_path / "store"))
    (tmp_path / "scratch").mkdir()
    path = repo / "specs" / "s.toml"
    path.write_text(SPEC)
    return path


def test_a_mmdebstrap_that_fails_gets_the_hint_its_failure_suggests(
    spec: Path, cli: Callable[..., CliResult]
) -> None:
    need_mmdebstrap()
    got = cli("lock", spec)
    assert got.exit_code == 3, got.stderr
    assert "mmdebstrap failed with exit code" in got.stderr
    assert "does not have a Release file" in got.stderr  # its own words
    assert "hint: the mirror does not serve that suite" in got.stderr
    assert "apt-get install mmdebstrap" not in got.stderr


def test_a_missing_mmdebstrap_is_told_how_to_install_it(
    spec: Path, cli: Callable[..., CliResult], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(bare))
    got = cli("lock", spec)
    assert got.exit_code == 3, got.stderr
    assert "mmdebstrap was not found" in got.stderr
    assert f"hint: {INSTALL}" in got.stderr


@pytest.mark.parametrize(
    ("script", "hint"),
    [
        ("echo 'E: Unable to locate package tini' >&2; exit 100", "not in that suite"),
        ("echo 'write: No space left on device' >&2; exit 1", "free disk space"),
        ("kill -9 $$", "killed by signal 9 SIGKILL (out of memory?"),
        ("echo 'something else went wrong' >&2; exit 2", None),
    ],
    ids=["apt-no-package", "disk-full", "killed", "nothing-to-say"],
)
def test_every_tool_failure_is_hinted_from_what_it_said(script: str, hint: str | None) -> None:
    for call in (
        lambda: proc.run(["sh", "-c", script], tool="mmdebstrap", hint=INSTALL),
        lambda: proc.run(["sh", "-c", script], tool="mmdebstrap", hint=INSTALL, stream=True),
        lambda: _read(["sh", "-c", script]),
    ):
        with pytest.raises(ToolFailed) as failed:
            call()
        assert failed.value.hint != INSTALL
        assert (failed.value.hint is None) if hint is None else (hint in (failed.value.hint or ""))


def _read(argv: list[str]) -> None:
    with proc.reading(argv, tool="mmdebstrap", hint=INSTALL) as f:
        f.read()


def test_the_install_hint_is_for_a_tool_that_is_not_there() -> None:
    with pytest.raises(ToolNotFound) as missing:
        proc.run(["/nonexistent/mmdebstrap", "--version"], tool="mmdebstrap", hint=INSTALL)
    assert missing.value.hint == INSTALL
