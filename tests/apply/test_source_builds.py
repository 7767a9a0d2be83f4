"""A source build through apply: F's C-extension fixture (tests/cases/fixtures-src/cext), locked
as an sdist from the tests' index, is compiled by gcc through the store (sourceplan/sourcebuild),
installed into the generation's venv and imported there; a re-apply finds it in the store and
compiles nothing (the same spec: nothing at all changes, no --yes needed; another spec with the
same build: a new generation from the stored wheel)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from apply.conftest import Experiment, Index, Machine, hand_edit
from support.fakesystemd import FakeSystemd
from support.registry import Registry

from envbuild.apply import generations as gens
from envbuild.apply.assemble import CHOICE
from envbuild.apply.paths import Paths
from envbuild.lock.core import lock_spec
from envbuild.spec import load_spec
from envbuild.store.core import Store

pytestmark = [pytest.mark.slow, pytest.mark.network]  # setuptools for the build, once

BUILD = """
[builds.fixture-cext]
version = "1.0.0"

[builds.fixture-cext.env]
CEXT_GREETING = "compiled for apply"
"""
GREET = "import fixture_cext; print(fixture_cext.greeting())"


def with_build(spec: Path) -> Path:
    spec.write_text(spec.read_text() + BUILD)
    lock_spec(load_spec(spec))
    return spec


def store_state(store: Store) -> tuple[list[str], list[str]]:
    """The store's build records and blobs (the install trees' choice records left out: they
    are apply's, not builds)."""
    builds = [
        key
        for key in store.derivations()
        if (drv := store.lookup(key)) is not None and drv.kind != CHOICE
    ]
    return builds, sorted(p.name for p in store.blobs.iterdir())


def greeting(gen: gens.Generation) -> str:
    done = subprocess.run(
        [gen.venv / "bin" / "python", "-c", GREET], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_a_source_built_extension_in_the_generation_and_reused(
    cli, experiment: Experiment, machine: Machine, source_index: Index, tmp_path: Path
) -> None:
    spec = with_build(experiment("tiny-a", index=source_index.url, lock=False))
    r = cli("apply", spec, "--root", machine.root, "--json")
    assert r.exit_code == 0, r.stderr
    out = r.json()
    checks = {c["name"]: c for c in out["preflight"]["checks"]}
    assert checks["builds"]["message"] == "fixture-cext: not in the store, will be compiled"
    assert "toolkit" not in checks  # a C extension needs no nvcc
    gen = gens.current(machine.paths)
    assert gen is not None and gen.meta.packages["fixture-cext"] == "1.0.0"

    # the compiled extension is in the venv, from the store's wheel, and it imports there
    site = next((gen.venv / "lib").glob("python3.*/site-packages"))
    assert len(list((site / "fixture_cext").glob("_hello*.so"))) == 1
    (link,) = (gen.path / "wheels").iterdir()
    assert link.name.startswith("fixture_cext-1.0.0-cp3") and link.name.endswith(".whl")
    assert link.is_symlink() and link.resolve().parent.name == "sha256"
    assert greeting(gen) == "compiled for apply"  # the build flag reached gcc
    store = Store(tmp_path / "store")
    built = store_state(store)
    (key,) = built[0]
    drv = store.lookup(key)
    assert drv is not None and drv.kind == "source-build"
    assert link.resolve() == store.blob_path(drv.outputs["wheel"])
    assert cli("generations", "--root", machine.root, "--verify").exit_code == 0
    pids = machine.systemd.running_pids()

    # the same spec again: the store holds the build, so the generation is found before
    # anything is built; its unit runs, so nothing changes and no --yes is needed
    r = cli("apply", spec, "--root", machine.root, "--json")
    assert r.exit_code == 0, r.stderr
    out = r.json()
    assert out["reused"] and out["up_to_date"] and out["generation"] == 1
    assert "builds" not in {c["name"] for c in out["preflight"]["checks"]}
    assert store_state(store) == built and machine.systemd.running_pids() == pids

    # another experiment with the same build: a new generation, the wheel from the store
    other = with_build(experiment("tiny-c", index=source_index.url, lock=False))
    r = cli("apply", other, "--root", machine.root, "--yes")
    assert r.exit_code == 0, r.stderr
    assert "fixture-cext 1.0.0: reusing the build" in r.stderr
    assert "building with MAX_JOBS" not in r.stderr
    assert store_state(store) == built  # nothing compiled, nothing added
    new = gens.current(machine.paths)
    assert new is not None and new.number == 2 and greeting(new) == "compiled for apply"


def test_store_gc_keeps_what_a_generation_links_until_the_generation_goes(
    cli, experiment: Experiment, machine: Machine, source_index: Index, tmp_path: Path
) -> None:
    """A generation's ``wheels/`` links point into the store: ``envbuild gc`` must not break
    them (nor drop the derivation, or the next apply would compile again) while a generation
    uses them, and frees them once ``generations --gc`` has removed every generation that did."""
    store = Store(tmp_path / "store")
    spec = with_build(experiment("tiny-a", index=source_index.url, lock=False))
    assert cli("apply", spec, "--root", machine.root).exit_code == 0
    first = gens.current(machine.paths)
    assert first is not None
    (link,) = (first.path / "wheels").iterdir()
    built = store_state(store)

    r = cli("gc", "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json()["removed_blobs"] == [] and r.json()["removed_derivations"] == []
    assert store_state(store) == built and link.resolve().is_file()
    assert cli("generations", "--root", machine.root, "--verify").exit_code == 0

    # the next experiment needs no build; once generations --gc has removed the first, the
    # store may free its wheel and the derivation that built it
    other = experiment("tiny-c", index=source_index.url)
    assert cli("apply", other, "--root", machine.root, "--yes").exit_code == 0
    assert cli("gc", "--json").json()["removed_blobs"] == []  # generation 1 still holds it
    r = cli("generations", "--root", machine.root, "--gc", "--keep", "1", "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json()["removed"] == [first.name]
    # fixture-cext's install tree was linked by generation 1 only
    assert len(r.json()["removed_trees"]) == 1
    (key,) = built[0]
    drv = store.lookup(key)
    assert drv is not None
    choices = [k for k in store.derivations() if store.lookup(k).kind == CHOICE]  # type: ignore[union-attr]
    r = cli("gc", "--json")
    # the build, and the record of which wheel went into fixture-cext's tree
    gone = set(r.json()["removed_derivations"])
    assert key in gone and len(gone) == 2 and (gone - {key}) < set(choices)
    assert drv.outputs["wheel"] in r.json()["removed_blobs"]
    assert not list(store.roots_dir.glob("apply-*.json"))  # the second keeps no store wheel


def test_a_snapshot_of_a_source_built_generation_is_applied_again(
    cli,
    experiment: Experiment,
    machine: Machine,
    source_index: Index,
    repo: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`apply SNAPSHOT` of an experiment with a source build: its generation is switched back
    to without the spec file; once that generation was edited by hand, it is rebuilt from the
    repository's spec (the same spec hash) with the stored wheel, compiling nothing."""
    store = Store(tmp_path / "store")
    spec = with_build(experiment("tiny-a", index=source_index.url, lock=False))
    assert cli("apply", spec, "--root", machine.root).exit_code == 0
    first = gens.current(machine.paths)
    assert first is not None
    kept = tmp_path / "tiny-a.snapshot.json"
    shutil.copy(first.snapshot_file, kept)
    built = store_state(store)
    assert cli("apply", experiment("tiny-c", index=source_index.url), "--root", machine.root,
               "--yes").exit_code == 0  # fmt: skip

    elsewhere = tmp_path / "elsewhere"  # not the repository: the generation's copies decide
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    r = cli("apply", kept, "--root", machine.root, "--yes", "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json()["generation"] == 1 and r.json()["reused"]
    assert "builds" not in {c["name"] for c in r.json()["preflight"]["checks"]}
    assert gens.current(machine.paths).number == 1  # type: ignore[union-attr]

    site = next((first.venv / "lib").glob("python3.*/site-packages"))
    hand_edit(site / "fixture_cext" / "__init__.py", "\n# debug line left behind\n")
    monkeypatch.chdir(repo)
    r = cli("apply", kept, "--root", machine.root, "--yes", "--json")
    assert r.exit_code == 0, r.stderr
    out = r.json()
    assert not out["reused"] and out["generation"] == 3
    assert [c["number"] for c in out["rejected"]] == [1]
    fresh = gens.current(machine.paths)
    assert fresh is not None and fresh.number == 3 and greeting(fresh) == "compiled for apply"
    assert store_state(store) == built  # the stored wheel, nothing compiled


@pytest.mark.registry
def test_two_machines_sharing_a_cache_compile_once(
    cli,
    experiment: Experiment,
    machine: Machine,
    source_index: Index,
    registry: Registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`apply --cache`: machine A compiles the source build and publishes it; machine B (its own
    root and store) pulls it and compiles nothing, and its preflight asks for no compiler."""
    spec = with_build(experiment("tiny-a", index=source_index.url, lock=False))
    cache = registry.ref("cache/apply")
    r = cli("apply", spec, "--root", machine.root, "--cache", cache, "--insecure", "--json")
    assert r.exit_code == 0, r.stderr
    assert "building with MAX_JOBS" in r.stderr
    (published,) = r.json()["cache"]["published"]
    assert r.json()["cache"]["hits"] == []

    monkeypatch.setenv("ENVBUILD_STORE", str(tmp_path / "store-b"))
    other = tmp_path / "root-b"
    other.mkdir()
    r = cli("apply", spec, "--root", other, "--cache", cache, "--insecure", "--dry-run", "--json")
    assert r.exit_code == 0, r.stderr
    assert "builds" not in {c["name"] for c in r.json()["preflight"]["checks"]}
    try:  # machine B's unit runs until the test stops it (the fixture stops machine A's)
        r = cli("apply", spec, "--root", other, "--cache", cache, "--insecure")
        assert r.exit_code == 0, r.stderr
        assert "building with MAX_JOBS" not in r.stderr
        assert f"cache {cache}: 1 build(s) pulled, 0 published" in r.stdout
        b = Store(tmp_path / "store-b")
        assert b.lookup(published) is not None
        gen = gens.current(Paths(other))
        assert gen is not None and greeting(gen) == "compiled for apply"
    finally:
        FakeSystemd(Paths(other)).stop_all()
