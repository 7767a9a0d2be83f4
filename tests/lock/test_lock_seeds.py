"""The committed locks: every spec under specs/ has a current lock in lockfiles/ with its Debian
base pinned, and (with the network) relocking the seed specs against PyPI gives the committed
bytes — reusing the pinned base, so the Debian mirror moving on changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from envbuild.lock.core import check_lock, driver_warnings, lock_path
from envbuild.lock.io import read_lock
from envbuild.lock.model import DebianBaseLock
from envbuild.spec import load_spec

REPO = Path(__file__).resolve().parent.parent.parent
SPECS = sorted((REPO / "specs").glob("*.toml"))


SEEDS = {"glm5-gguf", "kimi-nvfp4", "minimax-m25-fp8", "kimi-k25-int4"}


def test_there_are_seed_specs():
    assert {p.stem for p in SPECS} >= SEEDS


@pytest.mark.parametrize("spec", SPECS, ids=[p.stem for p in SPECS])
def test_committed_lock_is_current(spec):
    check = check_lock(load_spec(spec))
    assert check.ok, "\n".join(c.message for c in check.changes) + (
        f"\nrelock with: envbuild lock {check.spec}"
    )


def test_committed_debian_bases_are_pinned_and_the_seeds_share_one():
    pinned = {}
    for spec in SPECS:
        loaded = load_spec(spec)
        if loaded.spec.base.kind != "debian":
            continue
        base = read_lock(lock_path(loaded)).envbuild.base
        assert isinstance(base, DebianBaseLock) and base.packages, f"{spec.name}: not pinned"
        assert base.include == sorted(set(loaded.spec.base.packages))
        assert set(base.include) <= {p.name for p in base.packages}
        pinned[spec.stem] = base
    seeds = [pinned[name] for name in sorted(SEEDS)]
    assert all(base == seeds[0] for base in seeds)


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_the_seed_locks_run_time_compilers_are_newer_than_their_driver(name):
    """CUDA 13.5's nvjitlink, nvcc and nvvm came in through torch's and flashinfer's
    dependencies; the specs' driver 590.48.01 runs CUDA 13.1. Locking says so (apply too)."""
    loaded = load_spec(REPO / "specs" / f"{name}.toml")
    [warning] = driver_warnings(loaded, read_lock(lock_path(loaded)))
    assert "nvidia-nvjitlink 13.5.37" in warning and "newer than CUDA 13.1" in warning
    assert "driver 590.48.01" in warning and "13.1.*" in warning


def test_a_lock_without_run_time_compilers_has_no_driver_warning():
    loaded = load_spec(REPO / "specs" / "quickstart.toml")
    assert driver_warnings(loaded, read_lock(lock_path(loaded))) == []


def test_glm5_locks_flash_attn_as_an_sdist_with_its_flags():
    lock = read_lock(REPO / "lockfiles" / "pylock.glm5-gguf.toml")
    (build,) = lock.envbuild.builds
    assert (build.name, build.version) == ("flash-attn", "2.8.3.post2")
    assert build.sdist.name == "flash_attn-2.8.3.post2.tar.gz"
    assert build.env["FLASH_ATTENTION_FORCE_BUILD"] == "TRUE"
    assert lock.package("flash-attn").wheels == []
    assert lock.package("torch").version == "2.14.0"
    assert lock.package("vllm").version == "0.33.0"
    assert lock.package("vllm-gguf-plugin") is not None


@pytest.mark.network
@pytest.mark.parametrize("name", ["glm5-gguf", "minimax-m25-fp8"])
def test_relocking_a_seed_against_pypi_gives_the_committed_bytes(cli, name, tmp_path):
    spec = REPO / "specs" / f"{name}.toml"
    out = tmp_path / f"pylock.{name}.toml"
    result = cli("lock", spec, "--output", out)
    assert result.exit_code == 0, result.stderr
    assert out.read_bytes() == lock_path(load_spec(spec)).read_bytes()
