"""Patched wheels come from the store: a spec's patch is applied to the locked wheel (as a store
derivation), installed in the generation and verifiable; the next experiment without the patch
gets a pristine venv (no stale patch survives a switch, unlike an in-place upgrade)."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest
from apply.conftest import CASES, Experiment, Machine
from support.registry import Registry

from envbuild.apply import generations as gens
from envbuild.apply.inputs import from_spec
from envbuild.apply.wheels import StoreWheels
from envbuild.lock.core import lock_spec
from envbuild.lock.wheels import select_wheels
from envbuild.registry.api import Endpoint
from envbuild.registry.ref import parse_repo
from envbuild.spec import load_spec
from envbuild.store.remote import CachedStore, RemoteCache

pytestmark = pytest.mark.slow


def vllm_patch(version: str) -> str:
    """A -p1 patch (paths relative to site-packages) to the fake vllm's cli.py."""
    old = (CASES / "fake_vllm.py").read_text().replace("@VERSION@", version)
    new = old.replace(
        'print(f"fake vllm {VERSION}: serving', 'print(f"patched vllm {VERSION}: serving'
    )
    assert new != old
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            "a/vllm/cli.py",
            "b/vllm/cli.py",
        )
    )


def with_patch(spec: Path, repo: Path) -> Path:
    (repo / "specs" / "patches").mkdir(exist_ok=True)
    (repo / "specs" / "patches" / "vllm.patch").write_text(vllm_patch("0.0.1"))
    spec.write_text(spec.read_text() + '\n[patches]\nvllm = ["patches/vllm.patch"]\n')
    lock_spec(load_spec(spec))
    return spec


def site_packages(gen: gens.Generation) -> Path:
    return next((gen.venv / "lib").glob("python3.*/site-packages"))


def test_a_patched_wheel_from_the_store_and_no_stale_patch_after(
    cli, experiment: Experiment, machine: Machine, repo: Path
) -> None:
    spec = with_patch(experiment("tiny-a", lock=False), repo)
    r = cli("apply", spec, "--root", machine.root, "--json")
    assert r.exit_code == 0, r.stderr
    gen = gens.current(machine.paths)
    assert gen is not None
    version = gen.meta.packages["vllm"]
    assert version.startswith("0.0.1+envbuild.")
    site = site_packages(gen)
    assert "patched vllm" in (site / "vllm" / "cli.py").read_text()
    record = json.loads((site / f"vllm-{version}.dist-info" / "envbuild-patches.json").read_text())
    assert [p["path"] for p in record["patches"]] == ["specs/patches/vllm.patch"]
    # the wheel uv installed is the store's blob, by a name uv can read
    link = gen.path / "wheels" / f"vllm-{version}-py3-none-any.whl"
    assert link.is_symlink() and link.resolve().parent.name == "sha256"
    assert "patched vllm 0.0.1: serving" in machine.systemd.logs("envbuild-tiny-a.service")
    assert cli("generations", "--root", machine.root, "--verify").exit_code == 0

    # the next experiment: a newer vllm, no patch; its venv is built fresh from the lock
    plain = experiment("tiny-a", vllm="0.0.2")
    r = cli("apply", plain, "--root", machine.root, "--yes")
    assert r.exit_code == 0, r.stderr
    new = gens.current(machine.paths)
    assert new is not None and new.number == 2 and new.meta.packages["vllm"] == "0.0.2"
    assert "patched" not in (site_packages(new) / "vllm" / "cli.py").read_text()
    assert not (new.path / "wheels").exists()


def test_a_patched_spec_applied_again_needs_no_yes_while_the_store_holds_its_wheel(
    cli, experiment: Experiment, machine: Machine, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = with_patch(experiment("tiny-a", lock=False), repo)
    assert cli("apply", spec, "--root", machine.root).exit_code == 0
    pids = machine.systemd.running_pids()

    # the patched wheel is in the store: the generation's content hash is known up front, it is
    # current and its unit runs, so nothing will stop and no --yes is asked for
    r = cli("apply", spec, "--root", machine.root, "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json()["up_to_date"] and r.json()["reused"]
    assert machine.systemd.running_pids() == pids

    # with an empty store the hash is not known before the wheel is made again: --yes it is
    monkeypatch.setenv("ENVBUILD_STORE", str(repo / "empty-store"))
    r = cli("apply", spec, "--root", machine.root)
    assert r.exit_code == 3 and "FAIL  units" in r.stdout
    r = cli("apply", spec, "--root", machine.root, "--yes", "--json")
    assert r.exit_code == 0, r.stderr
    # the patch is made again, byte for byte: the same generation, still up to date
    assert r.json()["up_to_date"] and r.json()["generation"] == 1
    assert machine.systemd.running_pids() == pids
    assert [g.number for g in gens.list_generations(machine.paths)] == [1]


@pytest.mark.registry
def test_apply_takes_a_patched_wheel_from_the_remote_cache_before_fetching_what_it_patches(
    experiment: Experiment, repo: Path, registry: Registry, tmp_path: Path
) -> None:
    """Apply realizes patches as the build does (local store, then the remote cache, then make
    it): machine B pulls the patched vllm machine A published and never downloads the locked
    vllm wheel the patch applies to."""
    spec = with_patch(experiment("tiny-a", lock=False), repo)
    inp = from_spec(spec)
    (vllm,) = [w for w in select_wheels(inp.lock) if w.canonical == "vllm"]

    def cache() -> RemoteCache:
        return RemoteCache(
            parse_repo(registry.ref("cache/apply-patch")), endpoint=Endpoint(insecure=True)
        )

    a = CachedStore(tmp_path / "store-a", cache())
    made = StoreWheels(a).provide(inp)
    (published,) = a.remote.stats.published
    assert a.has_blob(f"sha256:{vllm.sha256}")  # A fetched the wheel to patch it

    b = CachedStore(tmp_path / "store-b", cache())
    assert StoreWheels(b).stored(inp) is None  # the local store alone does not hold it
    got = StoreWheels(b).provide(inp)
    assert b.remote.stats.hits == [published] and b.remote.stats.published == []
    assert got["vllm"].sha256 == made["vllm"].sha256
    assert got["vllm"].version.startswith("0.0.1+envbuild.")
    assert not b.has_blob(f"sha256:{vllm.sha256}")  # the patched wheel came; the original did not
    assert StoreWheels(b).stored(inp) == got
