"""File modes in a snapshot: RECORD has none, so the snapshot keeps each distribution's usual mode
and the files with another; verify and diff name a file whose mode changed since, in full and
quick checks alike (a library or a console script losing its x bit, every file of a distribution
chmodded at once, a file that is gone since), and a hand-edited mode is a clear error."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from support.recordednvml import h200
from support.wheels import make_wheel

from envbuild.errors import ManifestError
from envbuild.fsio import canonical_json
from envbuild.snapshot.core import Options, take_snapshot
from envbuild.snapshot.diff.render import render_text
from envbuild.snapshot.model.core import parse_snapshot
from envbuild.snapshot.verify import verify
from snapshot.conftest import pip_install, site_packages


def take(venv: Path, mode: str) -> Any:
    return take_snapshot(
        Options(pythons=[str(venv)], integrity=mode, docker=False, systemd=False, models=False,
                nvml=h200("idle"))  # type: ignore[arg-type]
    )  # fmt: skip


def write(snap: Any, path: Path) -> Path:
    path.write_text(canonical_json(snap.model_dump(mode="json")))
    return path


def lines_of(manifest: Path, mode: str) -> list[str]:
    result = verify(manifest, integrity=mode, nvml=h200("idle"))  # type: ignore[arg-type]
    return render_text(result.diff, only_counted=True)


def dist(snap: Any, name: str) -> Any:
    return next(d for d in snap.pythons[0].distributions if d.name == name)


def umasked(mode: int) -> str:
    return f"{stat.S_IMODE(mode):04o}"


def test_a_library_and_a_console_script_losing_their_x_bit_are_named(
    venv: Path, tmp_path: Path
) -> None:
    make_wheel(tmp_path / "w", "gamma", "1.0",
               {"gamma/__init__.py": "def main(): pass\n", "gamma/_ext.so": b"\x7fELF not really"},
               scripts={"gamma-run": "gamma:main"})  # fmt: skip
    pip_install(venv, str(tmp_path / "w" / "gamma-1.0-py3-none-any.whl"))
    site = site_packages(venv)
    library, script = site / "gamma" / "_ext.so", venv / "bin" / "gamma-run"
    library.chmod(0o755)  # as a real wheel's shared library is installed
    usual = umasked((site / "gamma" / "__init__.py").stat().st_mode)
    shown = os.path.relpath(script, site)  # as RECORD names it: ../../../bin/gamma-run
    manifests = {}
    for mode in ("full", "quick"):
        snap = take(venv, mode)
        modes = dist(snap, "gamma").modes
        assert modes.usual == usual
        assert modes.other == {"0755": sorted([shown, "gamma/_ext.so"])}
        manifests[mode] = write(snap, tmp_path / f"{mode}.json")
    library.chmod(0o644)
    script.chmod(0o644)
    for recorded in ("full", "quick"):
        for now in ("full", "quick"):
            lines = lines_of(manifests[recorded], now)
            assert "  gamma/_ext.so (gamma): mode 0755 → mode 0644" in lines, lines
            assert f"  {shown} (gamma): mode 0755 → mode 0644" in lines, lines


def test_every_file_of_a_distribution_chmodded_is_one_change_of_its_usual_mode(
    venv: Path, tmp_path: Path
) -> None:
    manifest = write(take(venv, "full"), tmp_path / "snap.json")
    site = site_packages(venv)
    [info] = site.glob("beta-*.dist-info")
    files = [site / "beta" / "__init__.py", *info.iterdir()]
    before = umasked(files[0].stat().st_mode)
    for f in files:
        f.chmod(0o600)
    lines = lines_of(manifest, "quick")
    assert f"  the other files of beta: mode {before} → mode 0600" in lines, lines
    data = verify(manifest, integrity="quick", nvml=h200("idle")).as_dict()  # type: ignore[arg-type]
    [group] = [g for g in data["groups"] if g["key"].startswith("modes ")]
    [change] = group["changes"]
    assert change["item"] == {"kind": "file modes", "environment": str(venv),
                              "distribution": "beta"}  # fmt: skip
    assert change["after_fields"] == {"status": "mode changed", "mode": "0600"}


def test_a_file_gone_since_is_missing_not_a_mode_change(venv: Path, tmp_path: Path) -> None:
    init = site_packages(venv) / "alpha" / "__init__.py"
    init.chmod(0o755)
    snap = take(venv, "quick")
    assert dist(snap, "alpha").modes.other == {"0755": ["alpha/__init__.py"]}
    manifest = write(snap, tmp_path / "snap.json")
    init.unlink()
    lines = lines_of(manifest, "full")
    assert "  alpha/__init__.py (alpha): ∅ → missing" in lines, lines
    assert not [x for x in lines if "mode" in x], lines


@pytest.mark.parametrize("bad", ["rwxr-xr-x", "755", "0899", "10755"])
def test_a_hand_edited_mode_is_a_clear_error(venv: Path, bad: str) -> None:
    data = json.loads(canonical_json(take(venv, "quick").model_dump(mode="json")))
    alpha = next(d for d in data["pythons"][0]["distributions"] if d["name"] == "alpha")
    alpha["modes"]["other"] = {bad: ["alpha/__init__.py"]}
    with pytest.raises(ManifestError, match="invalid snapshot"):
        parse_snapshot(data, "snap.json")
    alpha["modes"] = {"usual": bad, "other": {}}
    with pytest.raises(ManifestError, match="invalid snapshot"):
        parse_snapshot(data, "snap.json")


@pytest.mark.skipif(os.geteuid() != 0, reason="a file of mode 0000 is unreadable but to root")
def test_a_file_made_mode_0000_is_named(venv: Path, tmp_path: Path) -> None:
    manifest = write(take(venv, "quick"), tmp_path / "snap.json")
    init = site_packages(venv) / "alpha" / "__init__.py"
    before = umasked(init.stat().st_mode)
    init.chmod(0)
    assert dist(take(venv, "full"), "alpha").modes.other == {"0000": ["alpha/__init__.py"]}
    lines = lines_of(manifest, "quick")
    assert f"  alpha/__init__.py (alpha): mode {before} → mode 0000" in lines, lines
