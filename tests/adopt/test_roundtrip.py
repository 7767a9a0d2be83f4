"""The round trip with real wheels from PyPI: a venv installed with uv and edited by hand
(a real package's module, a second package's ``__init__``, one file no RECORD lists) →
``envbuild adopt`` → ``envbuild lock --check`` → ``envbuild apply`` into a rehearsal root →
``envbuild verify`` of the new generation against a snapshot of the hand-built venv."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest
from adopt.conftest import make_venv, served, site_packages
from apply.conftest import Machine
from support.wheels import make_wheel

from envbuild.apply import generations as gens

pytestmark = [pytest.mark.network, pytest.mark.slow]

PINS = ("six==1.16.0", "idna==3.10", "packaging==24.2")


def _files(site: Path) -> dict[str, bytes]:
    """Every file of site-packages but metadata folders and bytecode."""
    return {
        p.relative_to(site).as_posix(): p.read_bytes()
        for p in site.rglob("*")
        if p.is_file()
        and "__pycache__" not in p.parts
        and not p.relative_to(site).parts[0].endswith(".dist-info")
    }


def test_adopt_lock_apply_verify(cli, repo: Path, tmp_path: Path, machine: Machine) -> None:
    venv = make_venv(tmp_path / "hand", *PINS)
    site = site_packages(venv)
    with (site / "six.py").open("a") as f:
        f.write("\n# fixed by hand on the box\nPATCHED_BY_HAND = True\n")
    init = site / "packaging" / "__init__.py"
    init.write_text(init.read_text().replace('__version__ = "24.2"', '__version__ = "24.2.hand"'))
    (site / "idna" / "debug_dump.py").write_text("DUMP = True\n")

    snap = tmp_path / "hand.json"
    args = ("snapshot", "--python", venv, "--no-docker", "--no-systemd", "--no-models", "-o", snap)
    assert cli(*args).exit_code == 0

    r = cli("adopt", "--python", venv, "--name", "hand", "--repo", repo, "--json")
    assert r.exit_code == 0, r.stderr
    adopted = r.json()
    assert sorted(p["name"] for p in adopted["pinned"]) == ["idna", "packaging", "six"]
    assert adopted["rebuild_needed"] == [] and adopted["not_adopted"] == []
    assert {p["dist"]: (p["files"], p["new"]) for p in adopted["patches"]} == {
        "idna": (["idna/debug_dump.py"], ["idna/debug_dump.py"]),
        "packaging": (["packaging/__init__.py"], []),
        "six": (["six.py"], []),
    }
    assert adopted["unrecorded"] == []  # the one file in no RECORD is a new file of idna's patch

    spec = repo / "specs" / "hand.toml"
    check = cli("lock", "--check", spec)
    assert check.exit_code == 0, check.stdout + check.stderr

    applied = cli("apply", spec, "--root", machine.root, "--json")
    assert applied.exit_code == 0, applied.stderr
    gen = gens.current(machine.paths)
    assert gen is not None
    new_site = site_packages(gen.venv)

    # the same distributions and versions (the patched ones as envbuild's local versions of
    # them), and the same bytes in every file: the hand edits and the unrecorded file are
    # there, as declared patches
    assert {k: v.split("+envbuild.")[0] for k, v in gen.meta.packages.items()} == {
        "idna": "3.10",
        "packaging": "24.2",
        "six": "1.16.0",
    }
    assert _files(new_site) == _files(site)
    assert (new_site / "idna" / "debug_dump.py").read_bytes() == b"DUMP = True\n"

    # and verify, which compares distributions by name, public version and the bytes of their
    # files, finds nothing: the patches that make the generation so are said, as info
    verified = cli("verify", snap, "--python", gen.venv)
    assert verified.exit_code == 0, verified.stdout
    lines = verified.stdout.splitlines()
    assert lines[0] == f"no drift from {snap}"
    info = sorted(line for line in lines if line.startswith("info: "))
    assert [line.split(":")[1].strip() for line in info] == ["idna", "packaging", "six"]
    assert all("has the same files as" in line for line in info), info
    assert "patches/hand/six.patch" in info[2] and "1.16.0+envbuild." in info[2]
    assert len(lines) == 4, lines

    # and a real edit is never hidden: a copy of the generation with one file edited, or with
    # a file no RECORD lists, is drift, named
    edited = _writable_copy(gen.venv, tmp_path / "edited")
    with (site_packages(edited) / "six.py").open("a") as f:
        f.write("# edited in the generation\n")
    found = cli("verify", snap, "--python", edited)
    assert found.exit_code == 1, found.stdout
    assert any(x.startswith("  six.py (six): ") for x in found.stdout.splitlines()), found.stdout
    assert "no drift" not in found.stdout

    added = _writable_copy(gen.venv, tmp_path / "added")
    (site_packages(added) / "idna" / "later.py").write_text("LATER = True\n")
    found = cli("verify", snap, "--python", added)
    assert found.exit_code == 1, found.stdout
    lines = found.stdout.splitlines()
    assert "  idna/later.py (idna): ∅ → added (not in its RECORD)" in lines, found.stdout


def test_a_path_two_distributions_list_verifies_and_its_edit_is_named(
    cli, repo: Path, tmp_path: Path, machine: Machine
) -> None:
    """Two wheels that ship one path with the same bytes (a namespace's ``__init__``): the
    round trip verifies clean, and an edit of that path in the generation is named."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    shared = {"nsp/__init__.py": "# a namespace both ship\n"}
    files = [
        make_wheel(wheels, "alpha", "1.0", {**shared, "nsp/alpha.py": "A = 1\n"}),
        make_wheel(wheels, "beta", "1.0", {**shared, "nsp/beta.py": "B = 1\n"}),
    ]
    venv = make_venv(tmp_path / "hand", "alpha==1.0", "beta==1.0", find_links=wheels)
    snap = tmp_path / "hand.json"
    args = ("snapshot", "--python", venv, "--no-docker", "--no-systemd", "--no-models", "-o", snap)
    assert cli(*args).exit_code == 0
    with served(files, tmp_path / "ix") as url:
        r = cli("adopt", "--python", venv, "--name", "ns", "--index", url, "--repo", repo)
        assert r.exit_code == 0, r.stderr
        spec = repo / "specs" / "ns.toml"
        check = cli("lock", "--check", spec)
        assert check.exit_code == 0, check.stdout + check.stderr
        applied = cli("apply", spec, "--root", machine.root, "--json")
        assert applied.exit_code == 0, applied.stderr
    gen = gens.current(machine.paths)
    assert gen is not None
    verified = cli("verify", snap, "--python", gen.venv)
    assert verified.exit_code == 0, verified.stdout
    first, *info = verified.stdout.splitlines()
    assert first == f"no drift from {snap}"
    # (the RECORDs differ: installed from a folder of wheels, then from an index)
    assert [x.split(":")[1].strip() for x in info] == ["alpha", "beta"], info
    assert all(x.startswith("info: ") and x.endswith(", the same files") for x in info), info

    edited = _writable_copy(gen.venv, tmp_path / "edited")
    (site_packages(edited) / "nsp" / "__init__.py").write_text("# edited\n")
    found = cli("verify", snap, "--python", edited)
    assert found.exit_code == 1, found.stdout
    lines = [x.strip() for x in found.stdout.splitlines()]
    for owner in ("alpha", "beta"):
        assert any(x.startswith(f"nsp/__init__.py ({owner}): ") for x in lines), found.stdout


def _writable_copy(venv: Path, to: Path) -> Path:
    """A copy of a (read-only) generation's venv that can be edited."""
    shutil.copytree(venv, to, symlinks=True)
    for path in [to, *to.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
    cfg = to / "pyvenv.cfg"
    cfg.write_text(cfg.read_text().replace(str(venv), str(to)))
    return to
