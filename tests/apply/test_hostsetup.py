"""`envbuild render host-setup`: a POSIX shell script (checked with sh -n and shellcheck), with the
spec's driver and toolkit, that does nothing when both are already there."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from apply.conftest import Experiment

SEED = Path(__file__).resolve().parents[2] / "specs" / "kimi-k25-int4.toml"


def stub(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def test_the_script_for_a_seed_spec(cli, tmp_path: Path) -> None:
    out = tmp_path / "host-setup.sh"
    r = cli("render", "host-setup", SEED, "-o", out)
    assert r.exit_code == 0, r.stderr
    text = out.read_text()
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert text.startswith("#!/bin/sh\n")
    assert "DRIVER_VERSION='590.48.01'" in text
    assert "TOOLKIT_PACKAGE='cuda-toolkit-13-1'" in text
    assert "https://developer.download.nvidia.com/compute/cuda/repos" in text
    assert "Pin: version $DRIVER_VERSION-*" in text
    assert subprocess.run(["sh", "-n", str(out)], check=False).returncode == 0
    # the same bytes on stdout
    assert cli("render", "host-setup", SEED).stdout == text


def test_shellcheck_finds_nothing(cli, tmp_path: Path) -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (scripts/test installs it)")
    out = tmp_path / "host-setup.sh"
    assert cli("render", "host-setup", SEED, "-o", out).exit_code == 0
    done = subprocess.run(
        ["shellcheck", "--shell=sh", str(out)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout


def run_script(script: Path, bin_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "LC_ALL": "C.UTF-8"}
    return subprocess.run(["sh", str(script)], capture_output=True, text=True, env=env, check=False)


def test_it_does_nothing_when_the_driver_is_in_place(
    cli, experiment: Experiment, tmp_path: Path
) -> None:
    spec = experiment("tiny-a", lock=False)  # [host] driver 590.48.01, no [cuda]
    script = tmp_path / "host-setup.sh"
    assert cli("render", "host-setup", spec, "-o", script).exit_code == 0
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub(bin_dir, "id", "echo 0")
    stub(bin_dir, "nvidia-smi", "echo 590.48.01")
    for tool in ("apt-get", "dpkg", "curl"):
        stub(bin_dir, tool, f"echo '{tool} must not run' >&2; exit 99")
    done = run_script(script, bin_dir)
    assert done.returncode == 0, done.stderr
    assert "nothing to do" in done.stdout

    stub(bin_dir, "id", "echo 1000")
    done = run_script(script, bin_dir)
    assert done.returncode == 1 and "run me as root" in done.stderr


def test_a_spec_without_host_is_refused(cli, repo: Path) -> None:
    spec = repo / "specs" / "nohost.toml"
    spec.write_text(
        'name = "nohost"\n[base]\nkind = "debian"\n[python]\nversion = "3.11"\n'
        "[resolution]\nexclude_newer = 2026-01-01T00:00:00Z\n"
    )
    r = cli("render", "host-setup", spec)
    assert r.exit_code == 2
    assert "no [host] table" in r.stderr
