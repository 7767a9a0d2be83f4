"""Distributions compared by what is true of their bytes (envbuild.snapshot.diff.same): a venv
edited by hand and a venv of the envbuild-patched wheel whose patch makes the same edit verify
clean (the patch said as info); a patch that makes another edit, or an executable bit, is drift
that names the file. Real wheels, real uv, envbuild's own patch step (GNU patch)."""

from __future__ import annotations

import hashlib
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from support.recordednvml import h200
from support.wheels import make_wheel

from envbuild.fsio import canonical_json
from envbuild.proc import core as proc
from envbuild.snapshot.core import Options, take_snapshot
from envbuild.snapshot.diff.render import render_text
from envbuild.snapshot.verify import verify
from envbuild.sourcebuild.patches import PatchRef, patch_wheel, unpatched_version
from snapshot.conftest import site_packages, uv_install

FILES = {"gamma/__init__.py": "X = 1\n", "gamma/mod.py": "def f():\n    return 1\n"}
EDITED = "def f():\n    return 2\n"


def _venv(path: Path, wheel: Path) -> Path:
    subprocess.run([proc.find_uv(), "venv", "-q", "-p", sys.executable, str(path)], check=True)
    uv_install(path, "--offline", "--no-deps", str(wheel))
    return path


def _patched(tmp: Path, wheel: Path, new: str, name: str) -> Path:
    patch = tmp / f"{name}.patch"
    patch.write_text(
        "--- a/gamma/mod.py\n+++ b/gamma/mod.py\n@@ -1,2 +1,2 @@\n def f():\n"
        f"-    return 1\n+{new.splitlines()[1]}\n"
    )
    ref = PatchRef(
        path=f"patches/{name}.patch", sha256=hashlib.sha256(patch.read_bytes()).hexdigest()
    )
    made = patch_wheel(wheel, [(patch, ref)], "0123456789", tmp / name)
    return tmp / name / made.wheel


def _read_only(site: Path) -> None:
    """As a generation is: no write bits anywhere."""
    for p in site.rglob("*"):
        if p.is_file():
            p.chmod(stat.S_IMODE(p.stat().st_mode) & ~0o222)


@pytest.fixture
def hand(tmp_path: Path) -> tuple[Path, Path]:
    wheel = make_wheel(tmp_path / "w", "gamma", "1.0", FILES)
    venv = _venv(tmp_path / "hand", wheel)
    (site_packages(venv) / "gamma" / "mod.py").write_text(EDITED)
    snap = take_snapshot(
        Options(pythons=[str(venv)], docker=False, systemd=False, models=False, nvml=h200("idle"))
    )
    manifest = tmp_path / "hand.json"
    manifest.write_text(canonical_json(snap.model_dump(mode="json")))
    [gamma] = [d for d in snap.pythons[0].distributions if d.name == "gamma"]
    assert gamma.files_sha256 is not None and [m.path for m in gamma.modified] == ["gamma/mod.py"]
    return manifest, wheel


def _check(manifest: Path, venv: Path) -> tuple[bool, list[str]]:
    result = verify(manifest, pythons=[str(venv)], nvml=h200("idle"))  # type: ignore[arg-type]
    return result.drift, render_text(result.diff, only_counted=True)


def test_a_patch_that_makes_the_hand_edit_verifies_clean(
    hand: tuple[Path, Path], tmp_path: Path
) -> None:
    manifest, wheel = hand
    venv = _venv(tmp_path / "gen", _patched(tmp_path, wheel, EDITED, "same"))
    _read_only(site_packages(venv))
    drift, lines = _check(manifest, venv)
    assert not drift, lines
    [info] = [line for line in lines if line.startswith("info: ")]
    assert info.startswith("info: gamma: 1.0+envbuild.0123456789 (this machine) has the same files")
    assert "patches/same.patch" in info


def test_a_patch_that_makes_another_edit_is_drift_naming_the_file(
    hand: tuple[Path, Path], tmp_path: Path
) -> None:
    manifest, wheel = hand
    venv = _venv(tmp_path / "gen", _patched(tmp_path, wheel, "def f():\n    return 3\n", "other"))
    drift, lines = _check(manifest, venv)
    assert drift
    want = (
        "  gamma: 1.0 → 1.0+envbuild.0123456789 (other files: gamma/mod.py differs from a "
        "RECORD; the two RECORDs differ, so other paths may too)"
    )
    assert any(line.startswith(want) for line in lines), lines  # (and the size moved)
    assert not any(line.startswith("info: ") for line in lines), lines


def test_an_executable_bit_still_counts_in_a_read_only_tree(
    hand: tuple[Path, Path], tmp_path: Path
) -> None:
    manifest, wheel = hand
    venv = _venv(tmp_path / "gen", _patched(tmp_path, wheel, EDITED, "same"))
    site = site_packages(venv)
    _read_only(site)
    (site / "gamma" / "__init__.py").chmod(0o555)
    drift, lines = _check(manifest, venv)
    assert drift
    assert [line for line in lines if line.startswith("  ")] == [
        "  gamma/__init__.py (gamma): mode 0644 → mode 0555"
    ], lines


def test_the_patch_marker_is_the_only_version_part_set_aside() -> None:
    assert unpatched_version("1.16.0+envbuild.0123456789") == "1.16.0"
    assert unpatched_version("2.9.0+cu130.envbuild.0123456789") == "2.9.0+cu130"
    assert unpatched_version("2.9.0+cu130") == "2.9.0+cu130"
    assert unpatched_version("1.0") == "1.0"


@pytest.mark.parametrize(("hand_mode", "drift"), [(0o644, False), (0o755, True)])
def test_an_unrecorded_file_a_patch_creates_is_compared_by_mode(
    tmp_path: Path, hand_mode: int, drift: bool
) -> None:
    """An unrecorded file of the hand-built venv that the generation's patch creates (listed
    there, read-only): the same file when only the write bits differ, drift naming both modes
    when its executable bit went."""
    wheel = make_wheel(tmp_path / "w", "gamma", "1.0", FILES)
    venv = _venv(tmp_path / "hand", wheel)
    new = site_packages(venv) / "gamma" / "new.py"
    new.write_text("N = 1\n")
    new.chmod(hand_mode)
    snap = take_snapshot(
        Options(pythons=[str(venv)], docker=False, systemd=False, models=False, nvml=h200("idle"))
    )
    manifest = tmp_path / "hand.json"
    manifest.write_text(canonical_json(snap.model_dump(mode="json")))
    patch = tmp_path / "new.patch"
    patch.write_text("--- /dev/null\n+++ b/gamma/new.py\n@@ -0,0 +1 @@\n+N = 1\n")
    ref = PatchRef(path="patches/new.patch", sha256=hashlib.sha256(patch.read_bytes()).hexdigest())
    made = patch_wheel(wheel, [(patch, ref)], "0123456789", tmp_path / "new")
    gen = _venv(tmp_path / "gen", tmp_path / "new" / made.wheel)
    _read_only(site_packages(gen))
    found, lines = _check(manifest, gen)
    assert found is drift, lines
    shown = [line for line in lines if line.startswith("  ")]
    assert shown == ([f"  gamma/new.py (gamma): mode {hand_mode:04o} → mode 0444"] if drift else [])
