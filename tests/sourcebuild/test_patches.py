"""Patching a wheel as a derivation: GNU patch, a local version, a RECORD that verifies."""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from sourcebuild.conftest import store_state
from support.sdists import FIXTURES

from envbuild.errors import InputFileError, PatchFailed, UserError
from envbuild.fsio import sha256_file
from envbuild.proc import core as proc
from envbuild.sourcebuild.patches import (
    PatchRef,
    patch_inputs,
    patch_wheel,
    patched_version,
    realize_patch,
    verify_record,
)
from envbuild.store.core import Store, derivation_key

PATCHES = FIXTURES.parent / "patches"


@pytest.fixture(scope="session")
def pure_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fixture_pure 2.1.0, built from tests/cases/fixtures-src/purepy by its PEP 517 backend."""
    out = tmp_path_factory.mktemp("purewheel")
    src = FIXTURES / "purepy"
    uv = proc.find_uv()
    env = proc.child_env({"UV_PYTHON_DOWNLOADS": "never"})
    subprocess.run(
        [uv, "build", "--wheel", "--no-build-isolation", "--python", sys.executable, "--out-dir",
         str(out), str(src)],
        check=True, capture_output=True, env=env,
    )  # fmt: skip
    (wheel,) = out.glob("*.whl")
    return wheel


def ref(name: str) -> tuple[Path, PatchRef]:
    path = PATCHES / name
    return path, PatchRef(path=f"tests/cases/patches/{name}", sha256=sha256_file(path))


def install_and_run(wheel: Path, tmp: Path, code: str) -> tuple[str, Path]:
    """Install ``wheel`` with uv into a fresh venv and run ``code``: (stdout, site-packages)."""
    uv = proc.find_uv()
    env = proc.child_env({"UV_PYTHON_DOWNLOADS": "never"})
    venv = tmp / "venv"
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True, env=env)
    python = str(venv / "bin" / "python")
    install = [uv, "pip", "install", "-q", "--offline", "--no-deps", "--python", python, str(wheel)]
    subprocess.run(install, check=True, env=env, capture_output=True)
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    (site,) = (venv / "lib").glob("python3*/site-packages")
    return done.stdout.strip(), site


def installed_record_problems(site: Path, dist_info: str) -> list[str]:
    """Files whose installed bytes differ from what the installed RECORD says."""
    problems = []
    with (site / dist_info / "RECORD").open() as f:
        for path, digest, size in csv.reader(f):
            if not digest:
                continue
            data = (site / path).read_bytes()
            want = (
                "sha256="
                + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            )
            if digest != want or int(size) != len(data):
                problems.append(path)
    return problems


def test_patched_wheel_installs_and_verifies(pure_wheel: Path, tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    result = realize_patch(store, "fixture-pure", pure_wheel, [ref("pure-fix.patch")])
    patched = result.patched
    short = result.key[:10]
    assert not result.reused
    assert (
        patched.patched_version == f"2.1.0+envbuild.{short}" == patched_version("2.1.0", result.key)
    )
    assert patched.wheel == f"fixture_pure-2.1.0+envbuild.{short}-py3-none-any.whl"
    assert patched.files == ["fixture_pure/__init__.py", "fixture_pure/models.py"]
    assert result.key == derivation_key(
        "patch",
        patch_inputs("fixture-pure", pure_wheel.name, sha256_file(pure_wheel), patched.patches),
    )
    stored = tmp_path / patched.wheel
    stored.write_bytes(store.blob_path(result.wheel_digest).read_bytes())
    assert verify_record(stored) == []
    with zipfile.ZipFile(stored) as zf:
        names = zf.namelist()
        info = f"fixture_pure-2.1.0+envbuild.{short}.dist-info"
        assert names[-1] == f"{info}/RECORD"
        assert {i.date_time for i in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}
        assert "Version: 2.1.0+envbuild." + short in zf.read(f"{info}/METADATA").decode()
        listing = json.loads(zf.read(f"{info}/envbuild-patches.json"))
        assert listing["patches"] == [p.model_dump() for p in patched.patches]
    out, site = install_and_run(
        stored, tmp_path, "import importlib.metadata as m, fixture_pure as p; from fixture_pure "
        "import models; print(p.answer(), models.kv_cache_dtype(120), m.version('fixture-pure'))",
    )  # fmt: skip
    assert out == f"42 fp8_e4m3 2.1.0+envbuild.{short}"
    assert installed_record_problems(site, info) == []
    again = realize_patch(store, "fixture-pure", pure_wheel, [ref("pure-fix.patch")])
    assert again.reused and again.wheel_digest == result.wheel_digest


def test_repacking_is_deterministic(pure_wheel: Path, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one = patch_wheel(pure_wheel, [ref("pure-fix.patch")], "0123456789", tmp_path / "a")
    two = patch_wheel(pure_wheel, [ref("pure-fix.patch")], "0123456789", tmp_path / "b")
    assert one.sha256 == two.sha256 == sha256_file(tmp_path / "a" / one.wheel)


def test_a_tampered_record_is_caught(pure_wheel: Path, tmp_path: Path) -> None:
    patched = patch_wheel(pure_wheel, [ref("pure-fix.patch")], "0123456789", tmp_path)
    bad = tmp_path / "bad.whl"
    with zipfile.ZipFile(tmp_path / patched.wheel) as src, zipfile.ZipFile(bad, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename == "fixture_pure/__init__.py":
                data = data.replace(b"42", b"43")
            dst.writestr(item, data)
    assert verify_record(bad) == [
        "fixture_pure/__init__.py: RECORD says "
        + _record_hash(tmp_path / patched.wheel, "fixture_pure/__init__.py")
        + "; file is "
        + _record_hash(bad, "fixture_pure/__init__.py")
    ]


def _record_hash(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as zf:
        data = zf.read(name)
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest},{len(data)}"


def test_a_patch_that_does_not_apply_names_file_and_hunk(pure_wheel: Path, tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    before = store_state(store)
    with pytest.raises(PatchFailed) as err:
        realize_patch(
            store, "fixture-pure", pure_wheel, [ref("pure-fix.patch"), ref("pure-stale.patch")]
        )
    # the first patch applied; the second finds the file already changed where its hunk #1 was
    with pytest.raises(PatchFailed) as alone:
        realize_patch(store, "fixture-pure", pure_wheel, [ref("pure-stale.patch")])
    assert alone.value.message.startswith("tests/cases/patches/pure-stale.patch: does not apply")
    assert alone.value.hunks == ["hunk #1 of fixture_pure/__init__.py FAILED at line 2"]
    assert "Hunk #1 FAILED" in "\n".join(alone.value.lines())
    assert err.value.patch == "tests/cases/patches/pure-stale.patch"
    assert store_state(store) == before


def test_a_patch_for_a_file_the_wheel_lacks(pure_wheel: Path, tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    with pytest.raises(PatchFailed) as err:
        realize_patch(store, "fixture-pure", pure_wheel, [ref("pure-missing-file.patch")])
    assert err.value.hunks and "fixture_pure/nothere.py" in err.value.hunks[0]
    assert "does not exist" in err.value.hunks[0]
    assert store.derivations() == []


def test_a_patch_changed_since_the_lock(pure_wheel: Path, tmp_path: Path) -> None:
    path, good = ref("pure-fix.patch")
    stale = PatchRef(path=good.path, sha256="0" * 64)
    with pytest.raises(UserError, match="the lock says 0000"):
        realize_patch(Store(tmp_path / "s"), "fixture-pure", pure_wheel, [(path, stale)])
    with pytest.raises(InputFileError, match="no such patch file"):
        realize_patch(
            Store(tmp_path / "s"), "fixture-pure", pure_wheel, [(tmp_path / "x.patch", good)]
        )


@pytest.mark.network
def test_a_real_pypi_wheel(tmp_path: Path) -> None:
    env = proc.child_env()
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
         "six==1.16.0", "-d", str(tmp_path)],
        check=True, env=env,
    )  # fmt: skip
    wheel = tmp_path / "six-1.16.0-py2.py3-none-any.whl"
    assert sha256_file(wheel) == "8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254"
    store = Store(tmp_path / "store")
    result = realize_patch(store, "six", wheel, [ref("six-1.16.0-marker.patch")])
    stored = tmp_path / result.patched.wheel
    stored.write_bytes(store.blob_path(result.wheel_digest).read_bytes())
    assert verify_record(stored) == []
    out, site = install_and_run(stored, tmp_path, "import six; print(six.__patched_by__, six.PY3)")
    assert out == "envbuild True"
    assert installed_record_problems(site, f"six-{result.patched.patched_version}.dist-info") == []
    assert os.path.exists(
        site / f"six-{result.patched.patched_version}.dist-info" / "envbuild-patches.json"
    )


def test_a_wheel_stored_as_a_blob_is_patched_under_its_file_name(
    pure_wheel: Path, tmp_path: Path
) -> None:
    store = Store(tmp_path / "store")
    digest = store.add_file(pure_wheel)
    by_name = realize_patch(store, "fixture-pure", pure_wheel, [ref("pure-fix.patch")])
    blob = store.blob_path(digest)  # named by its sha256, as the build's fetch stage keeps it
    from_blob = realize_patch(
        store, "fixture-pure", blob, [ref("pure-fix.patch")], filename=pure_wheel.name
    )
    assert from_blob.reused and from_blob.key == by_name.key
    assert from_blob.patched.wheel.startswith("fixture_pure-2.1.0+envbuild.")
