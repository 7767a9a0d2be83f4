"""``envbuild adopt`` on a venv built by hand with the real uv from a local index, then edited:
pins, patches, builds, what it refuses to guess, and that it writes nothing but its outputs."""

from __future__ import annotations

import json
import shutil
import tomllib
import zipfile
from pathlib import Path

import pytest
from adopt.conftest import make_venv, served, site_packages, tree_digest
from support.sdists import pack_sdist
from support.wheels import make_wheel

from envbuild.lock.io import read_lock
from envbuild.sourcebuild.patches import PatchRef, patch_wheel
from envbuild.spec.validate import validate

CORE = "def answer():\n    return 41\n"


@pytest.fixture
def hand_built(tmp_path: Path) -> tuple[Path, str, dict[str, Path]]:
    """A venv of alpha, beta (published), gamma (published, but installed from another build of
    the same version) and delta (on no index), with hand edits; and the index URL."""
    pub, local = tmp_path / "published", tmp_path / "local"
    alpha = make_wheel(
        pub, "alpha", "1.0",
        {"alpha/__init__.py": "", "alpha/core.py": CORE, "alpha/gone.py": "X = 1\n"},
        requires=("beta",),
    )  # fmt: skip
    beta = make_wheel(pub, "beta", "2.0", {"beta/__init__.py": "", "beta/data.bin": b"\0\1\2"})
    gamma = make_wheel(pub, "gamma", "1.0", {"gamma/__init__.py": "BUILT = 'upstream'\n"})
    src = tmp_path / "gamma-src"
    (src / "gamma").mkdir(parents=True)
    (src / "gamma" / "__init__.py").write_text("BUILT = 'upstream'\n")
    sdist = pack_sdist(src, "gamma", "1.0", pub)
    make_wheel(local, "gamma", "1.0", {"gamma/__init__.py": "BUILT = 'here, with my flags'\n"})
    make_wheel(local, "delta", "0.1", {"delta/__init__.py": ""})
    for wheel in (alpha, beta):
        (local / wheel.name).write_bytes(wheel.read_bytes())
    venv = make_venv(tmp_path / "hand", "alpha", "beta", "gamma", "delta", find_links=local)
    site = site_packages(venv)
    (site / "alpha" / "core.py").write_text(CORE.replace("41", "42"))
    (site / "alpha" / "gone.py").unlink()
    (site / "alpha" / "debug.py").write_text("print('left here by hand')\n")
    (site / "beta" / "data.bin").write_bytes(b"\0\1\3")
    (site / "gamma" / "__init__.py").write_text("BUILT = 'here, edited'\n")
    (site / "gamma" / "notes.txt").write_text("of a rebuilt distribution\n")
    (site / "stray_top.py").write_text("# of no distribution\n")
    return venv, "", {"alpha": alpha, "beta": beta, "gamma": gamma, "sdist": sdist}


def test_adopt_pins_patches_and_names_what_it_cannot_adopt(
    cli, repo: Path, tmp_path: Path, hand_built: tuple[Path, str, dict[str, Path]]
) -> None:
    venv, _, files = hand_built
    before = tree_digest(venv)
    with served(
        [files["alpha"], files["beta"], files["gamma"], files["sdist"]], tmp_path / "ix"
    ) as url:
        r = cli(
            "adopt", "--python", venv, "--name", "hand", "--index", url, "--repo", repo, "--json"
        )
        assert r.exit_code == 0, r.stderr
        got = r.json()
        check = cli("lock", "--check", repo / "specs" / "hand.toml")
        assert check.exit_code == 0, check.stdout + check.stderr

    assert [p["name"] for p in got["pinned"]] == ["alpha", "beta"]
    rebuild = {b["name"]: b for b in got["rebuild_needed"]}
    assert (
        "RECORD lines differ" in rebuild["gamma"]["reason"] and rebuild["gamma"]["sdist_on_index"]
    )
    assert "no wheel" in rebuild["delta"]["reason"] and not rebuild["delta"]["sdist_on_index"]
    assert any("delta 0.1 is left out" in n for n in got["notes"])
    assert got["patches"] == [
        {
            "dist": "alpha",
            "path": "patches/hand/alpha.patch",
            "files": ["alpha/core.py", "alpha/debug.py", "alpha/gone.py"],
            "new": ["alpha/debug.py"],  # in no RECORD: a new file of the patch
        }
    ]
    not_adopted = {(n["dist"], n["path"]): n["reason"] for n in got["not_adopted"]}
    assert "not a text edit" in not_adopted[("beta", "beta/data.bin")]
    assert "rebuilt from source" in not_adopted[("gamma", "gamma/__init__.py")]
    # a file in no RECORD that no patch can carry stays listed: of a rebuilt distribution, or
    # of no distribution
    assert got["unrecorded"] == ["gamma/notes.txt", "stray_top.py"]

    # only its outputs were written, and the environment was not touched
    assert sorted(tree_digest(repo)) == [
        "lockfiles/pylock.hand.toml", "patches/hand/alpha.patch", "specs/hand.toml"
    ]  # fmt: skip
    assert tree_digest(venv) == before

    spec = tomllib.loads((repo / "specs" / "hand.toml").read_text())
    assert spec["packages"] == {"alpha": "==1.0", "beta": "==2.0"}
    assert spec["builds"] == {"gamma": {"version": "1.0"}}
    assert spec["patches"] == {"alpha": ["../patches/hand/alpha.patch"]}
    validate(repo / "specs" / "hand.toml")
    lock = read_lock(repo / "lockfiles" / "pylock.hand.toml")
    assert [p.name for p in lock.packages] == ["alpha", "beta", "gamma"]
    assert lock.envbuild.patches["alpha"][0].path == "patches/hand/alpha.patch"

    # the patch, applied as build and apply apply it, gives the edited bytes
    patch = repo / "patches" / "hand" / "alpha.patch"
    ref = PatchRef(path="patches/hand/alpha.patch", sha256=lock.envbuild.patches["alpha"][0].sha256)
    made = patch_wheel(files["alpha"], [(patch, ref)], "0123456789", tmp_path / "patched")
    with zipfile.ZipFile(tmp_path / "patched" / made.wheel) as zf:
        assert zf.read("alpha/core.py") == (site_packages(venv) / "alpha" / "core.py").read_bytes()
        assert zf.read("alpha/debug.py") == b"print('left here by hand')\n"
        assert "alpha/gone.py" not in zf.namelist()
    assert sorted(made.files) == ["alpha/core.py", "alpha/debug.py", "alpha/gone.py"]


def test_adopt_keeps_an_existing_spec_and_refuses_bad_input(
    cli, repo: Path, tmp_path: Path
) -> None:
    wheel = make_wheel(tmp_path / "w", "alpha", "1.0", {"alpha/__init__.py": ""})
    venv = make_venv(tmp_path / "v", "alpha", find_links=tmp_path / "w")
    with served([wheel], tmp_path / "ix") as url:
        args = ("adopt", "--python", venv, "--name", "x", "--index", url, "--repo", repo)
        assert cli(*args).exit_code == 0
        text = (repo / "specs" / "x.toml").read_text()
        again = cli(*args)
        assert (
            again.exit_code == 2 and "exists already" in again.stderr and "--force" in again.stderr
        )
        assert (repo / "specs" / "x.toml").read_text() == text
        assert cli(*args, "--force").exit_code == 0
        bad = cli("adopt", "--python", tmp_path / "nothing", "--index", url, "--repo", repo)
        assert bad.exit_code == 2 and "no such interpreter" in bad.stderr
        name = cli("adopt", "--python", venv, "--name", "Bad Name", "--index", url, "--repo", repo)
        assert name.exit_code == 2
    gone = cli("adopt", "--python", venv, "--name", "y", "--index", url, "--repo", repo, "--json")
    assert gone.exit_code == 3 and gone.json()["error"]["exit_code"] == 3
    assert not (repo / "specs" / "y.toml").exists()


def test_the_text_report_and_an_index_that_is_not_pep_691(cli, repo: Path, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "w", "alpha", "1.0", {"alpha/__init__.py": "", "alpha/a.py": ""})
    venv = make_venv(tmp_path / "v", "alpha", find_links=tmp_path / "w")
    (site_packages(venv) / "alpha" / "a.py").write_text("EDITED = 1\n")
    (site_packages(venv) / "alpha" / "stray.txt").write_text("?\n")
    with served([wheel], tmp_path / "ix") as url:
        r = cli("adopt", "--python", venv, "--name", "t", "--index", url, "--repo", repo)
        assert r.exit_code == 0, r.stderr
        assert "adopted t: specs/t.toml, lockfiles/pylock.t.toml (1 packages)" in r.stdout
        assert (
            "patch patches/t/alpha.patch (alpha): alpha/a.py, alpha/stray.txt (new: in no RECORD)"
            in r.stdout
        )
        assert "unrecorded" not in r.stdout
        # a unit that cannot be read fails before anything is downloaded: exit 3 where systemd
        # does not run (here, CI), 2 where it runs and has no such unit
        store = tmp_path / "store"
        shutil.rmtree(store, ignore_errors=True)
        args = ("--name", "u", "--index", url, "--repo", repo, "--unit", "no-such-vllm-unit")
        unit = cli("adopt", "--python", venv, *args)
        assert unit.exit_code in (2, 3) and "no-such-vllm-unit" in unit.stderr
        assert not store.exists() and not (repo / "specs" / "u.toml").exists()
        # a project page in HTML only (PEP 503) is named, not misread as "not published"
        page = tmp_path / "ix" / "simple" / "alpha" / "index.json"
        page.write_text("<html><body>alpha-1.0-py3-none-any.whl</body></html>")
        html = cli("adopt", "--python", venv, "--name", "h", "--index", url, "--repo", repo)
        assert html.exit_code == 3 and "not a PEP 691 JSON project page" in html.stderr


def test_a_release_yanked_since_it_was_installed_is_still_pinned(
    cli, repo: Path, tmp_path: Path
) -> None:
    wheel = make_wheel(tmp_path / "w", "alpha", "1.0", {"alpha/__init__.py": ""})
    venv = make_venv(tmp_path / "v", "alpha", find_links=tmp_path / "w")
    with served([wheel], tmp_path / "ix") as url:
        page = tmp_path / "ix" / "simple" / "alpha" / "index.json"
        data = json.loads(page.read_text())
        data["files"][0]["yanked"] = "a bug"
        page.write_text(json.dumps(data))
        r = cli("adopt", "--python", venv, "--name", "y", "--index", url, "--repo", repo, "--json")
        assert r.exit_code == 0, r.stderr
        assert [p["name"] for p in r.json()["pinned"]] == ["alpha"]
        assert cli("lock", "--check", repo / "specs" / "y.toml").exit_code == 0
