"""A corrupt store blob is found and never passed on (offline builds, real uv and zstd).

For a blob of each kind (a base layer, a Python layer, an overlap report, the image config and
manifest, a wheel) one byte is flipped in place: `envbuild store verify` names it (and the
derivation whose output it is) and exits 1; a build then never links or archives it: the output
folder it writes holds only blobs that hash to their names, with the same image digest as
before; `store verify --repair` removes what is broken and the next verify exits 0. A flip that
no stat shows (the stamp forged, as a disk's own damage would look) is still found by `store
verify`, and a build that reads the blob says which blob is corrupt and how to fix it.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, CliResult
from support.outputs import build_args, folder_image
from support.project import write_project
from support.wheels import make_wheel, ref

from envbuild.store.core import Store
from envbuild.store.stamps import file_stamp

Build = Callable[..., CliResult]


def flip(path: Path, at: int | None = None) -> None:
    """Change one byte of a read-only file in place (its stat changes, as any write's does)."""
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if at is None else at
    data[i] ^= 0x01
    with path.open("r+b") as f:
        f.write(data)
    os.chmod(path, 0o444)


def forge_stamp(store: Store, digest: str) -> None:
    """Make the store believe the blob's current bytes were hashed: damage no stat shows."""
    path = store.blob_path(digest)
    (store.stamps / path.name).write_text(file_stamp(path.stat()))


@pytest.fixture
def built(repo: Path, cli: Build) -> tuple[Path, dict[str, Any]]:
    d = repo / "wheels"
    wheels = [
        ref(make_wheel(d, "alpha", "1.0", {"alpha.py": "A = 1\n" * 500})),
        ref(make_wheel(d, "beta", "1.0", {"beta.py": "B = 2\n"})),
    ]
    spec = write_project(repo, "img", wheels)
    first = cli(*build_args(repo, spec, repo / "out", "--json"))
    assert first.exit_code == 0, first.stderr
    return spec, first.json()


def victim(store: Store, manifest: dict[str, Any], kind: str) -> str:
    if kind == "base-layer":
        return str(manifest["layers"][0]["digest"])
    if kind == "python-layer":
        return str(next(x["digest"] for x in manifest["layers"] if x["kind"] != "base"))
    if kind in ("config", "manifest"):
        return str(manifest["config" if kind == "config" else "image"])
    drvs = [store.lookup(k) for k in store.derivations()]
    if kind == "overlaps":
        return next(d.outputs["report"] for d in drvs if d is not None and d.kind == "overlaps")
    raise AssertionError(kind)


KINDS = ["base-layer", "python-layer", "overlaps", "config", "manifest"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_corrupt_blob_is_found_and_never_passed_on(
    repo: Path, built: tuple[Path, dict[str, Any]], cli: Build, kind: str
) -> None:
    spec, manifest = built
    store = Store(repo / "store")
    digest = victim(store, manifest, kind)
    flip(store.blob_path(digest))
    found = cli("store", "verify", "--store", repo / "store", "--json")
    assert found.exit_code == 1, found.stderr
    report = found.json()
    assert report["corrupt_blobs"] == [digest]
    blob_problem = next(p for p in report["problems"] if p["what"] == "blob")
    assert blob_problem["name"] == digest and "store verify" not in blob_problem["fix"]
    if kind in ("base-layer", "python-layer", "overlaps"):
        assert blob_problem["derivations"], "a derivation's output names its derivation"
        assert report["broken_derivations"]
    text = cli("store", "verify", "--store", repo / "store")
    assert text.exit_code == 1
    assert digest in text.stdout and "fix: " in text.stdout
    # the build (the old folder and a new one, with and without the docker archive) rebuilds
    # or rewrites what is corrupt: nothing it writes is corrupt, the digest is the same
    for out, extra in ((repo / "out", ()), (repo / "fresh", ("--no-docker-archive",))):
        again = cli(*build_args(repo, spec, out, *extra))
        assert again.exit_code == 0, again.stderr
        assert again.stdout.strip() == manifest["image"]
        assert folder_image(out) == manifest["image"]
    assert cli("store", "verify", "--store", repo / "store").exit_code == 0


def test_repair_removes_what_is_broken(
    repo: Path, built: tuple[Path, dict[str, Any]], cli: Build
) -> None:
    spec, manifest = built
    store = Store(repo / "store")
    digests = [victim(store, manifest, k) for k in KINDS]
    for digest in digests:
        flip(store.blob_path(digest))
    result = cli("store", "verify", "--repair", "--store", repo / "store", "--json")
    assert result.exit_code == 1
    assert sorted(result.json()["corrupt_blobs"]) == sorted(digests)
    assert all(p["repaired"] for p in result.json()["problems"])
    assert not any(store.has_blob(d) for d in digests)
    assert cli("store", "verify", "--store", repo / "store").exit_code == 0
    again = cli(*build_args(repo, spec, repo / "out"))
    assert again.exit_code == 0, again.stderr
    assert again.stdout.strip() == manifest["image"]
    assert folder_image(repo / "out") == manifest["image"]


def test_damage_no_stat_shows(repo: Path, built: tuple[Path, dict[str, Any]], cli: Build) -> None:
    """The stamp forged: `store verify` still hashes and finds it; a build that reads the layer
    for the docker archive names the blob and the fix (not "install zstd")."""
    spec, manifest = built
    store = Store(repo / "store")
    digest = victim(store, manifest, "python-layer")
    flip(store.blob_path(digest), at=40)  # inside the zstd frame
    forge_stamp(store, digest)
    found = cli("store", "verify", "--store", repo / "store", "--json")
    assert found.exit_code == 1 and found.json()["corrupt_blobs"] == [digest]
    result = cli(*build_args(repo, spec, repo / "elsewhere"))
    assert result.exit_code == 3, result.stderr
    assert f"store blob {digest}" in result.stderr
    assert "store verify --repair" in result.stderr
    assert "install" not in result.stderr
    assert folder_image(repo / "elsewhere") is None  # it says it holds nothing complete


def test_a_corrupt_wheel_is_fetched_again(
    repo: Path, built: tuple[Path, dict[str, Any]], cli: Build
) -> None:
    """A wheel whose layer must be made again: a corrupt copy is fetched again; one whose
    damage no stat shows reaches uv, whose hash error gets the store's hint, not the
    platform's."""
    spec, manifest = built
    store = Store(repo / "store")
    layer = next(x for x in manifest["layers"] if "alpha==1.0" in x["distributions"])
    drv = store.lookup(layer["key"])
    assert drv is not None
    alpha = next(d for d in drv.inputs["dists"] if d["name"] == "alpha")
    digest = f"sha256:{alpha['sha256']}"

    def forget_layer() -> None:
        (store.drvs / f"{layer['key']}.json").unlink()
        store.drop_blob(layer["digest"])

    forget_layer()
    flip(store.blob_path(digest))
    again = cli(*build_args(repo, spec, repo / "out"))
    assert again.exit_code == 0, again.stderr
    assert again.stdout.strip() == manifest["image"]
    assert store.check_blob(digest)
    forget_layer()
    flip(store.blob_path(digest))
    forge_stamp(store, digest)
    failed = cli(*build_args(repo, spec, repo / "out"))
    assert failed.exit_code == 3, failed.stderr
    assert "store verify --repair" in failed.stderr
    assert "platform" not in failed.stderr
    assert (
        json.loads((repo / "out" / "build-manifest.json").read_text())["image"]
        == (manifest["image"])
    )


# --- a blob's name taken by something else, or its mode changed (issue 24) ----------------------


def run_envbuild(*args: str | Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``envbuild ARGS`` in a child, so that a hang (a fifo opened for reading) fails the test
    instead of blocking it."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "envbuild", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize("kind", ["python-layer", "config"])
def test_a_fifo_in_place_of_a_blob_never_blocks(
    repo: Path, built: tuple[Path, dict[str, Any]], kind: str
) -> None:
    """This build hung forever: the stamp's re-hash opened the fifo. Now the fifo is no blob:
    verify says so, and a build makes the blob again, the same image."""
    spec, manifest = built
    store = Store(repo / "store")
    digest = victim(store, manifest, kind)
    path = store.blob_path(digest)
    path.unlink()
    os.mkfifo(path)
    again = run_envbuild(*build_args(repo, spec, repo / "out"), timeout=120)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == manifest["image"]
    assert folder_image(repo / "out") == manifest["image"]
    assert stat.S_ISREG(path.lstat().st_mode) and store.check_blob(digest)
    path.unlink()
    os.mkfifo(path)
    found = run_envbuild("store", "verify", "--store", repo / "store", "--json", timeout=60)
    assert found.returncode == 1, found.stderr
    problem = next(p for p in json.loads(found.stdout)["problems"] if p["name"] == digest)
    assert "it is a fifo, not a file" in problem["reason"]


def test_a_folder_in_place_of_a_blob_is_reported_removed_and_restored(
    repo: Path, built: tuple[Path, dict[str, Any]], cli: Build
) -> None:
    """`store verify --repair` exited 4 (IsADirectoryError) and builds kept failing. Now
    verify names it, repair removes it and puts the blob back from the output folder that
    holds it, and a build treats such a blob as missing."""
    spec, manifest = built
    store = Store(repo / "store")
    digest = victim(store, manifest, "python-layer")
    path = store.blob_path(digest)
    path.unlink()  # the output folder's hard link keeps the bytes
    path.mkdir()
    (path / "x").write_text("x")
    found = cli("store", "verify", "--store", repo / "store", "--json")
    assert found.exit_code == 1, found.stderr
    problem = next(p for p in found.json()["problems"] if p["name"] == digest)
    assert "it is a folder, not a file" in problem["reason"]
    assert digest in found.json()["corrupt_blobs"]
    repaired = cli("store", "verify", "--repair", "--store", repo / "store", "--json")
    assert repaired.exit_code == 1, repaired.stderr  # found (and repaired), not exit 4
    problem = next(p for p in repaired.json()["problems"] if p["name"] == digest)
    assert (
        problem["repaired"]
        and f"restored from the output folder {repo / 'out'}" in (problem["fix"])
    )
    assert stat.S_ISREG(path.lstat().st_mode) and stat.S_IMODE(path.stat().st_mode) == 0o444
    assert cli("store", "verify", "--store", repo / "store").exit_code == 0
    # with no output folder to restore it from, repair says so; a build makes it again
    path.unlink()
    path.mkdir()
    shutil.rmtree(repo / "out")
    repaired = cli("store", "verify", "--repair", "--store", repo / "store", "--json")
    problem = next(p for p in repaired.json()["problems"] if p["name"] == digest)
    assert "no output folder holds it: the next build makes or fetches it again" in (problem["fix"])
    path.mkdir()  # and a build over a folder there (no verify first) treats it as missing
    again = cli(*build_args(repo, spec, repo / "out"))
    assert again.exit_code == 0, again.stderr
    assert again.stdout.strip() == manifest["image"]
    assert folder_image(repo / "out") == manifest["image"]
    assert cli("store", "verify", "--store", repo / "store").exit_code == 0


def read_as_nobody(path: Path) -> bool:
    """Whether a user other than root can read ``path`` (``runuser -u nobody cat``)."""
    done = subprocess.run(
        ["runuser", "-u", "nobody", "--", "cat", str(path)], capture_output=True, check=False
    )
    return done.returncode == 0


@pytest.fixture
def shared_out() -> Iterator[Path]:
    """An output folder every user can reach (pytest's tmp folders are root's alone)."""
    top = Path(tempfile.mkdtemp(prefix="envbuild-mode-"))
    top.chmod(0o755)
    yield top / "out"
    shutil.rmtree(top, ignore_errors=True)


def test_a_blob_of_mode_0000_is_found_and_given_its_mode_back(
    repo: Path, built: tuple[Path, dict[str, Any]], cli: Build, shared_out: Path
) -> None:
    """Root reads a blob of mode 0000, so build, verify and repair let it pass, and the output
    folder's hard link to it was unreadable to every other user."""
    if shutil.which("runuser") is None:
        pytest.skip("needs runuser")
    spec, manifest = built
    store = Store(repo / "store")
    first = cli(*build_args(repo, spec, shared_out))
    assert first.exit_code == 0, first.stderr
    digest = victim(store, manifest, "python-layer")
    linked = shared_out / "oci" / "blobs" / "sha256" / digest[7:]
    if not os.path.samestat(linked.stat(), store.blob_path(digest).stat()):
        pytest.skip("the output folder is on another file system (blobs copied)")
    assert read_as_nobody(linked)
    store.blob_path(digest).chmod(0)
    assert not read_as_nobody(linked)
    found = cli("store", "verify", "--store", repo / "store", "--json")
    assert found.exit_code == 1, found.stderr
    assert found.json()["bad_modes"] == [digest] and not found.json()["corrupt_blobs"]
    problem = next(p for p in found.json()["problems"] if p["name"] == digest)
    assert "its mode is 0000, not 0444" in problem["reason"]
    repaired = cli("store", "verify", "--repair", "--store", repo / "store")
    assert repaired.exit_code == 1 and "repaired" in repaired.stdout
    assert stat.S_IMODE(store.blob_path(digest).stat().st_mode) == 0o444
    assert read_as_nobody(linked)
    assert cli("store", "verify", "--store", repo / "store").exit_code == 0
    # a build notices too (and puts the mode back), though root reads the blob
    store.blob_path(digest).chmod(0)
    again = cli(*build_args(repo, spec, shared_out))
    assert again.exit_code == 0, again.stderr
    assert "had mode 0000, not 0444" in again.stderr
    assert stat.S_IMODE(store.blob_path(digest).stat().st_mode) == 0o444
    assert read_as_nobody(linked)
    assert folder_image(shared_out) == manifest["image"]
