"""The stale-patch case: someone edits a file in the current generation's venv (as happened when
vLLM was upgraded in place and kept old patches). verify reports it; apply does not reuse that
generation but builds a fresh one; rollback refuses to go back to it."""

from __future__ import annotations

from pathlib import Path

import pytest
from apply.conftest import Experiment, Machine, hand_edit

from envbuild.apply import generations as gens

pytestmark = pytest.mark.slow


def site_packages(gen: gens.Generation) -> Path:
    return next((gen.venv / "lib").glob("python3.*/site-packages"))


def test_an_edited_generation_is_caught_and_replaced(
    cli, experiment: Experiment, machine: Machine
) -> None:
    spec = experiment("tiny-a")
    assert cli("apply", spec, "--root", machine.root).exit_code == 0
    first = gens.current(machine.paths)
    assert first is not None
    assert cli("generations", "--root", machine.root, "--verify").exit_code == 0

    patched = site_packages(first) / "vllm" / "cli.py"
    hand_edit(patched, "\n# hot fix, applied by hand\n")
    (site_packages(first) / "vllm" / "extra_patch.py").write_text("X = 1\n")

    r = cli("generations", "--root", machine.root, "--verify")
    assert r.exit_code == 1
    assert "MODIFIED" in r.stdout
    assert "venv: vllm: vllm/cli.py was modified" in r.stdout
    assert "venv: vllm: vllm/extra_patch.py was added" in r.stdout

    # the same spec again: preflight says the edited generation will not be reused, and that
    # replacing it restarts the unit, which needs --yes; nothing is built yet
    r = cli("apply", spec, "--root", machine.root)
    assert r.exit_code == 3
    assert "warn  generation  generation 1 has these inputs but was modified" in r.stdout
    assert "vllm/cli.py was modified" in r.stdout
    assert "FAIL  units       apply would stop the running unit(s) envbuild-tiny-a.service" in (
        r.stdout
    )
    assert gens.current(machine.paths).number == 1  # type: ignore[union-attr]
    assert [g.number for g in gens.list_generations(machine.paths)] == [1]

    r = cli("apply", spec, "--root", machine.root, "--yes", "--json")
    assert r.exit_code == 0, r.stderr
    out = r.json()
    assert out["generation"] == 2 and not out["reused"]
    assert out["rejected"][0]["number"] == 1
    # a write through the generation's hard link reached the install tree it shares
    assert any(
        p.startswith("venv: vllm: vllm/cli.py was modified in its shared install tree")
        for p in out["rejected"][0]["problems"]
    )
    second = gens.current(machine.paths)
    assert second is not None and second.number == 2
    assert second.meta.content_hash == first.meta.content_hash  # same inputs, fresh path
    assert second.path != first.path
    assert "hot fix" not in (site_packages(second) / "vllm" / "cli.py").read_text()
    assert out["switch"]["stopped"] == ["envbuild-tiny-a.service"]

    # and nobody is sent back to the edited one
    r = cli("rollback", "--root", machine.root)
    assert r.exit_code == 3
    assert "generation 1 was modified after it was built" in r.stderr
    assert gens.current(machine.paths).number == 2  # type: ignore[union-attr]

    # a later apply reuses the good generation, not the edited one
    r = cli("apply", spec, "--root", machine.root, "--json")
    assert r.exit_code == 0 and r.json()["generation"] == 2 and r.json()["up_to_date"]


def test_an_edited_unit_copy_in_the_generation_is_caught(
    cli, experiment: Experiment, machine: Machine
) -> None:
    spec = experiment("tiny-a")
    assert cli("apply", spec, "--root", machine.root).exit_code == 0
    gen = gens.current(machine.paths)
    assert gen is not None
    hand_edit(gen.path / "envbuild-tiny-a.service", "\nEnvironment=SNEAKY=1\n")
    r = cli("generations", "--root", machine.root, "--verify", "--json")
    assert r.exit_code == 1
    [listed] = r.json()["generations"]
    assert listed["check"]["problems"] == ["envbuild-tiny-a.service was modified"]


def test_a_wheel_published_with_a_wrong_record_is_not_mistaken_for_an_edit(
    cli, experiment: Experiment, machine: Machine
) -> None:
    from envbuild.lock.core import lock_spec
    from envbuild.spec import load_spec

    spec = experiment("tiny-a", lock=False)
    spec.write_text(spec.read_text() + '\n[packages]\noddrecord = "==1.0"\n')
    lock_spec(load_spec(spec))
    r = cli("apply", spec, "--root", machine.root)
    assert r.exit_code == 0, r.stderr
    assert "oddrecord 1.0: 1 file(s) differ from the wheel's own RECORD as published" in r.stderr
    gen = gens.current(machine.paths)
    assert gen is not None and list(gen.meta.record_exceptions) == [
        "oddrecord/oddrecord/_native.py"
    ]
    assert cli("generations", "--root", machine.root, "--verify").exit_code == 0
    # an edit of that very file is still caught
    hand_edit(site_packages(gen) / "oddrecord" / "_native.py", "BUILD = 3\n")
    r = cli("generations", "--root", machine.root, "--verify")
    assert r.exit_code == 1 and "oddrecord/_native.py was modified" in r.stdout


def test_a_hand_edited_unit_or_a_rotated_secret_is_put_right(
    cli, experiment: Experiment, machine: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The generation verifies, but what systemd runs is not it: the installed unit was edited
    (someone added a flag by hand), or the secrets file holds an old token. verify names the
    unit; apply reinstalls it from the generation (restarting the service needs --yes), and
    writes the new token."""
    spec = experiment("tiny-a")
    assert cli("apply", spec, "--root", machine.root).exit_code == 0
    gen = gens.current(machine.paths)
    assert gen is not None and gen.meta.unit is not None
    installed = machine.paths.unit_file(gen.meta.unit)
    original = installed.read_text()
    installed.write_text(
        original.replace("--tensor-parallel-size", "--enforce-eager --tensor-parallel-size")
    )

    r = cli("generations", "--root", machine.root, "--verify")
    assert r.exit_code == 1
    assert f"unit: {installed} was modified (it is not generation 1's unit)" in r.stdout
    r = cli("apply", spec, "--root", machine.root)
    assert r.exit_code == 3  # the running unit would restart: the user agrees first
    assert "apply would stop the running unit(s) envbuild-tiny-a.service" in r.stdout
    pids = machine.systemd.running_pids()
    r = cli("apply", spec, "--root", machine.root, "--yes", "--json")
    assert r.exit_code == 0, r.stderr
    assert not r.json()["up_to_date"] and r.json()["generation"] == 1
    assert installed.read_text() == original
    assert machine.systemd.running_pids() != pids  # restarted with the spec's settings
    assert cli("generations", "--root", machine.root, "--verify").exit_code == 0

    env_file = machine.paths.env_file("tiny-a")
    assert "hf_secret_token_" in env_file.read_text()
    monkeypatch.setenv("HF_TOKEN", "hf_rotated")
    r = cli("apply", spec, "--root", machine.root, "--yes", "--json")
    assert r.exit_code == 0, r.stderr
    assert not r.json()["up_to_date"]
    assert "hf_rotated" in env_file.read_text()
    assert "hf_secret_token_" not in env_file.read_text()
    assert oct(env_file.stat().st_mode & 0o777) == "0o600"
    r = cli("apply", spec, "--root", machine.root, "--json")  # now all is as it should be
    assert r.exit_code == 0 and r.json()["up_to_date"]


def test_a_repointed_or_rebuilt_interpreter_is_caught(
    cli, experiment: Experiment, machine: Machine, tmp_path: Path
) -> None:
    spec = experiment("tiny-a")
    assert cli("apply", spec, "--root", machine.root).exit_code == 0
    gen = gens.current(machine.paths)
    assert gen is not None and gen.meta.interpreter is not None
    python = gen.venv / "bin" / "python"
    real = python.resolve()
    assert gen.meta.interpreter.path == str(real)
    assert gen.meta.interpreter.version == gen.meta.python
    assert cli("generations", "--root", machine.root, "--verify").exit_code == 0

    # another build of the same Python: a copy elsewhere (same bytes), then changed bytes
    other = tmp_path / "other-python3.11"
    other.write_bytes(real.read_bytes())
    other.chmod(0o755)
    bindir = python.parent
    bindir.chmod(bindir.stat().st_mode | 0o200)
    link = python if python.is_symlink() else None
    assert link is not None, "the venv's python is expected to be a symlink (uv venv)"
    chain = python.readlink()
    python.unlink()
    python.symlink_to(other)
    r = cli("generations", "--root", machine.root, "--verify", "--json")
    assert r.exit_code == 1
    [listed] = r.json()["generations"]
    assert (
        f"interpreter: venv/bin/python leads to {other}, was {real}" in listed["check"]["problems"]
    )
    with other.open("ab") as f:
        f.write(b"\0")
    r = cli("generations", "--root", machine.root, "--verify", "--json")
    problems = r.json()["generations"][0]["check"]["problems"]
    assert any("is not the binary the generation was built with" in p for p in problems)
    python.unlink()
    python.symlink_to(chain)
    assert cli("generations", "--root", machine.root, "--verify").exit_code == 0


def test_re_applies_keep_the_first_snapshot_and_add_new_ones(
    cli, experiment: Experiment, machine: Machine
) -> None:
    spec = experiment("tiny-a")
    assert cli("apply", spec, "--root", machine.root).exit_code == 0
    gen = gens.current(machine.paths)
    assert gen is not None
    first = gen.snapshot_file.read_bytes()
    r = cli("apply", spec, "--root", machine.root, "--json")
    assert r.exit_code == 0 and r.json()["up_to_date"]
    assert gen.snapshot_file.read_bytes() == first  # the one from when it was made, as it was
    assert [p.name for p in gen.snapshot_files()] == [
        f"{gen.name}.snapshot.json",
        f"{gen.name}.snapshot.2.json",
    ]
    assert r.json()["snapshot"] == str(gen.snapshot_files()[-1])
    assert cli("apply", spec, "--root", machine.root).exit_code == 0
    assert gen.snapshot_files()[-1].name == f"{gen.name}.snapshot.3.json"
    assert (
        "already current and running: nothing switched"
        in cli("apply", spec, "--root", machine.root).stdout
    )


def test_a_spec_without_a_unit_is_not_said_to_be_running(
    cli, experiment: Experiment, machine: Machine
) -> None:
    from envbuild.lock.core import lock_spec
    from envbuild.spec import load_spec

    spec = experiment("tiny-a", lock=False)
    text = spec.read_text()
    spec.write_text(text[: text.index("[serve]")] + text[text.index("[resolution]") :])
    lock_spec(load_spec(spec))
    assert cli("apply", spec, "--root", machine.root).exit_code == 0
    r = cli("apply", spec, "--root", machine.root)
    assert r.exit_code == 0, r.stderr
    assert "already current (the spec has no unit): nothing switched" in r.stdout
    assert "running" not in r.stdout
