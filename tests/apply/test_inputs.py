"""What apply is given: a spec with a fresh lock, or a snapshot to recreate; and the mistakes
it refuses before touching anything (exit 2)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from apply.conftest import Experiment, Machine

from envbuild.apply import generations as gens

pytestmark = pytest.mark.slow


def test_apply_a_snapshot_recreates_what_it_recorded(
    cli,
    experiment: Experiment,
    machine: Machine,
    repo: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a = experiment("tiny-a")
    b = experiment("tiny-b", vllm="0.0.2", repo_id="org/tiny-b", revision="b" * 40)
    assert cli("apply", a, "--root", machine.root).exit_code == 0
    first = gens.current(machine.paths)
    assert first is not None
    kept = tmp_path / "experiment-a.snapshot.json"
    shutil.copy(first.snapshot_file, kept)
    assert cli("apply", b, "--root", machine.root, "--yes").exit_code == 0

    # the generation is still here: the snapshot brings it back, nothing is rebuilt
    r = cli("apply", kept, "--root", machine.root, "--yes", "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json()["generation"] == 1 and r.json()["reused"]
    assert r.json()["origin"] == str(kept)
    assert gens.current(machine.paths).number == 1  # type: ignore[union-attr]
    # the snapshot written again names the spec and lock, not the snapshot it came from
    rewritten = json.loads(first.snapshot_file.read_text())["spec"]
    assert rewritten["path"] == "specs/tiny-a.toml"
    assert rewritten["lock_path"] == "lockfiles/pylock.tiny-a.toml"

    # without the generation, the spec and lock it names are found in the repository (by
    # digest) and built again
    assert cli("apply", b, "--root", machine.root, "--yes").exit_code == 0
    assert cli("generations", "--root", machine.root, "--gc", "--keep", "0").exit_code == 0
    assert [g.number for g in gens.list_generations(machine.paths)] == [2]
    monkeypatch.chdir(repo)
    r = cli("apply", kept, "--root", machine.root, "--yes", "--json")
    assert r.exit_code == 0, r.stderr
    again = gens.current(machine.paths)
    assert again is not None and again.number == 3 and again.meta.spec_name == "tiny-a"
    assert again.meta.lock_sha256 == first.meta.lock_sha256

    # once the spec has moved on, the snapshot cannot be recreated from this checkout
    a.write_text(
        a.read_text().replace("gpu_memory_utilization = 0.85", "gpu_memory_utilization = 0.8")
    )
    assert cli("generations", "--root", machine.root, "--gc", "--keep", "0").exit_code == 0
    assert cli("apply", b, "--root", machine.root, "--yes").exit_code == 0
    assert cli("generations", "--root", machine.root, "--gc", "--keep", "0").exit_code == 0
    r = cli("apply", kept, "--root", machine.root, "--yes")
    assert r.exit_code == 2
    assert "changed since" in r.stderr and "check out the commit" in r.stderr


def test_a_snapshot_that_names_no_lock_is_refused(cli, machine: Machine, tmp_path: Path) -> None:
    """A machine snapshot taken without --spec records no spec and lock: nothing to recreate."""
    snap = tmp_path / "machine.json"
    r = cli("snapshot", "--no-models", "--no-docker", "--no-systemd", "-o", snap)
    assert r.exit_code == 0, r.stderr
    assert json.loads(snap.read_text())["spec"] is None
    r = cli("apply", snap, "--root", machine.root)
    assert r.exit_code == 2
    assert "names no spec and lock, so there is nothing to recreate" in r.stderr
    assert "envbuild snapshot --spec SPEC" in r.stderr
    assert gens.list_generations(machine.paths) == []


def test_a_snapshot_from_a_newer_envbuild_is_refused(cli, machine: Machine, tmp_path: Path) -> None:
    snap = tmp_path / "newer.json"
    snap.write_text(json.dumps({"kind": "envbuild.snapshot", "schema_version": 99}))
    r = cli("apply", snap, "--root", machine.root)
    assert r.exit_code == 2 and "newer" in r.stderr


def test_a_missing_or_stale_lock_is_a_user_error(
    cli, experiment: Experiment, machine: Machine
) -> None:
    spec = experiment("tiny-a", lock=False)
    r = cli("apply", spec, "--root", machine.root)
    assert r.exit_code == 2
    assert "lockfiles/pylock.tiny-a.toml: no such lock" in r.stderr
    assert f"envbuild lock {spec}" in r.stderr  # the spec as typed

    spec = experiment("tiny-a")
    spec.write_text(spec.read_text().replace("max_model_len = 4096", "max_model_len = 8192"))
    r = cli("apply", spec, "--root", machine.root)
    assert r.exit_code == 2
    assert "lockfiles/pylock.tiny-a.toml is stale" in r.stderr
    assert not (machine.root / "var" / "lib" / "envbuild" / "generations").exists()


def test_rollback_mistakes(cli, experiment: Experiment, machine: Machine) -> None:
    r = cli("rollback", "--root", machine.root)
    assert r.exit_code == 2 and "no generation is current yet" in r.stderr
    assert cli("apply", experiment("tiny-a"), "--root", machine.root).exit_code == 0
    r = cli("rollback", "--root", machine.root)
    assert r.exit_code == 2 and "nothing to roll back to" in r.stderr
    r = cli("rollback", "--root", machine.root, "--to", "9")
    assert r.exit_code == 2 and "there is no generation 9" in r.stderr
    r = cli("rollback", "--root", machine.root, "--to", "1")
    assert r.exit_code == 2 and "already current" in r.stderr
    r = cli("rollback", "1", "--root", machine.root)
    assert r.exit_code == 2 and "already current" in r.stderr
    r = cli("rollback", "1", "--to", "2", "--root", machine.root)
    assert r.exit_code == 2 and "give N once" in r.stderr
    r = cli("generations", "--root", machine.root, "--gc", "--keep", "-1")
    assert r.exit_code == 2
