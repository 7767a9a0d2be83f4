"""A switch cut short by SIGKILL is undone by the next envbuild: the journal says how far it got.

An ``envbuild apply`` runs as a real process and pauses right after a named step of the switch
(``ENVBUILD_TEST_PAUSE_AFTER``), where the test kills it with SIGKILL; then ``generations``,
``apply --recover``, ``rollback`` or the next ``apply`` finds the journal and puts the previous
generation and its unit back (the fake systemd really runs them), or finishes a switch whose unit
was already healthy. Units that are not envbuild's, stopped to free the GPUs, stay stopped after
a switch, are named, and come back with ``rollback --yes``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from apply.conftest import REV_B, Experiment, Machine

from envbuild.apply import generations as gens
from envbuild.apply.journal import PAUSE_ENV
from envbuild.apply.unit import unit_name

pytestmark = pytest.mark.slow

UNIT_A, UNIT_B = unit_name("tiny-a"), unit_name("tiny-b")
OTHER = "gpu-burner.service"  # a service that is not envbuild's and holds GPU memory


def port_of(spec: Path) -> int:
    line = next(x for x in spec.read_text().splitlines() if x.startswith("port = "))
    return int(line.split("=")[1])


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False


def wait_until(what: str, fn: object, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fn():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting until {what}")


def vllm_version(machine: Machine, unit: str) -> str | None:
    """The version the unit's fake vllm said it is, in the JSON line it printed last on start."""
    lines = machine.systemd.logs(unit, 200).splitlines()
    said = [json.loads(x) for x in lines if x.startswith("{")]
    return str(said[-1]["vllm"]) if said else None


def journal_step(machine: Machine) -> str | None:
    try:
        return str(json.loads(machine.paths.journal.read_text())["step"])
    except FileNotFoundError:
        return None


def add_other_service(machine: Machine) -> None:
    """A unit of someone else's that holds GPU memory (the fake NVML counts every running unit)."""
    machine.paths.units.mkdir(parents=True, exist_ok=True)
    machine.paths.unit_file(OTHER).write_text(
        f'[Service]\nExecStart={sys.executable} -c "import time; time.sleep(600)"\n'
    )
    machine.systemd.start(OTHER)
    assert machine.systemd.state(OTHER).active == "active"


class Before:
    """What the machine looked like with tiny-a serving, to compare after a recovery."""

    def __init__(self, machine: Machine, spec_a: Path) -> None:
        self.port = port_of(spec_a)
        self.unit_file = machine.paths.unit_file(UNIT_A).read_bytes()
        self.env_file = machine.paths.env_file("tiny-a").read_bytes()

    def holds(self, machine: Machine) -> None:
        cur = gens.current(machine.paths)
        assert cur is not None and cur.number == 1
        assert machine.systemd.state(UNIT_A).active == "active"
        wait_until("tiny-a serves again", lambda: healthy(self.port), 30)
        assert machine.paths.unit_file(UNIT_A).read_bytes() == self.unit_file
        assert machine.paths.env_file("tiny-a").read_bytes() == self.env_file
        assert machine.systemd.state(OTHER).active == "active"
        assert not machine.paths.journal.exists()
        assert not list(machine.paths.secrets.glob(".*before-switch"))


@pytest.fixture
def serving_a(cli, experiment: Experiment, machine: Machine) -> tuple[Path, Before]:
    """tiny-a applied (generation 1, its unit healthy) and someone else's GPU service running."""
    spec = experiment("tiny-a")
    assert cli("apply", spec, "--root", machine.root).exit_code == 0
    add_other_service(machine)
    return spec, Before(machine, spec)


def kill_apply_after(machine: Machine, step: str, spec: Path) -> None:
    proc = machine.spawn("apply", spec, "--root", machine.root, "--yes", **{PAUSE_ENV: step})
    try:

        def paused() -> bool:
            assert proc.poll() is None, proc.communicate()  # it ended: say why
            return journal_step(machine) == step

        wait_until(f"the apply records step {step}", paused)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize(
    ("step", "same_unit", "recover_with"),
    [
        ("stopped", False, ("generations",)),
        ("unit-installed", False, ("apply", "--recover")),
        ("current", True, ("apply", "--recover")),
        ("current", False, ("rollback",)),
        ("started", False, ("generations",)),
        ("started", True, ("rollback",)),
    ],
)
def test_a_switch_killed_at_each_step_is_undone_by_the_next_envbuild(
    cli,
    experiment: Experiment,
    machine: Machine,
    serving_a: tuple[Path, Before],
    step: str,
    same_unit: bool,
    recover_with: tuple[str, ...],
) -> None:
    _spec_a, before = serving_a
    if same_unit:  # the next version of the same experiment: the unit file is replaced
        new, new_unit = experiment("tiny-a", vllm="0.0.2", port=before.port), UNIT_A
    else:
        new, new_unit = (
            experiment("tiny-b", vllm="0.0.2", repo_id="org/tiny-b", revision=REV_B),
            UNIT_B,
        )
    kill_apply_after(machine, step, new)

    # killed mid-switch: the old unit is stopped (and more, the further it got)
    paths = machine.paths
    assert journal_step(machine) == step
    assert machine.systemd.state(OTHER).active == "inactive"
    if step == "started":  # the new generation's vllm runs
        assert machine.systemd.state(new_unit).active == "active"
        wait_until("0.0.2 runs", lambda: vllm_version(machine, new_unit) == "0.0.2", 30)
    if not (same_unit and step == "started"):
        assert machine.systemd.state(UNIT_A).active == "inactive"
    cur = gens.current(paths)
    assert cur is not None and cur.number == (2 if step in ("current", "started") else 1)

    r = cli(*recover_with, "--root", machine.root)
    assert r.exit_code == 0, r.stderr
    assert (
        "undid the unfinished apply (pid " in r.stdout
        and f"cut short after step '{step}') to generation 2" in r.stdout
    )
    assert "generation 1 is current again" in r.stdout
    assert f"started {UNIT_A} again" in r.stdout and f"started {OTHER} again" in r.stdout
    before.holds(machine)
    if not same_unit:
        assert not paths.unit_file(UNIT_B).exists() and not paths.env_file("tiny-b").exists()
        assert machine.systemd.state(UNIT_B).active == "inactive"
    assert vllm_version(machine, UNIT_A) == "0.0.1"  # the old generation's, not the new one's
    if recover_with == ("generations",):
        assert r.stdout.splitlines()[-2].startswith("*   1 ")  # then it lists, 1 current
    if recover_with == ("rollback",):
        assert "current: generation" not in r.stdout  # the undo was the rollback

    # nothing left to recover; the same apply now goes through
    r = cli("apply", "--recover", "--root", machine.root)
    assert r.stdout == "nothing to recover: no switch was cut short\n"
    r = cli("apply", new, "--root", machine.root, "--yes")
    assert r.exit_code == 0, r.stderr
    assert gens.current(paths).number == 2  # type: ignore[union-attr]
    assert [g.number for g in gens.list_generations(paths)] == [1, 2]


def test_the_next_apply_undoes_a_killed_one_first_and_then_applies(
    cli, experiment: Experiment, machine: Machine, serving_a: tuple[Path, Before]
) -> None:
    spec_a, before = serving_a
    b = experiment("tiny-b", vllm="0.0.2", repo_id="org/tiny-b", revision=REV_B)
    kill_apply_after(machine, "unit-installed", b)
    # a dry run changes nothing, but says what the real apply will undo first
    r = cli("apply", b, "--root", machine.root, "--dry-run", "--json")
    checks = {c["name"]: c for c in r.json()["preflight"]["checks"]}
    assert checks["journal"]["status"] == "warn"
    assert "after step 'unit-installed'" in checks["journal"]["message"]
    assert journal_step(machine) == "unit-installed"

    # generation 1 serves again after the undo: applying it is a no-op (no --yes needed, even
    # with the other service holding GPU memory again, as it did before)
    r = cli("apply", spec_a, "--root", machine.root, "--json")
    assert r.exit_code == 0, r.stderr
    out = r.json()
    assert out["recovered"]["step"] == "unit-installed" and out["recovered"]["previous"] == 1
    assert f"started {UNIT_A} again" in out["recovered"]["actions"]
    assert out["up_to_date"] and out["switch"] is None
    before.holds(machine)


def test_a_switch_killed_after_its_unit_became_healthy_is_finished(
    cli, experiment: Experiment, machine: Machine, serving_a: tuple[Path, Before]
) -> None:
    _spec_a, before = serving_a
    b = experiment("tiny-b", vllm="0.0.2", repo_id="org/tiny-b", revision=REV_B)
    kill_apply_after(machine, "healthy", b)
    assert machine.paths.unit_file(UNIT_A).exists()  # not retired yet
    r = cli("generations", "--root", machine.root, "--json")
    assert r.exit_code == 0, r.stderr
    rec = r.json()["recovered"]
    assert rec["finished"] and rec["actions"] == [f"enabled {UNIT_B}", f"retired {UNIT_A}"]
    assert [g["current"] for g in r.json()["generations"]] == [False, True]
    assert healthy(port_of(b)) and not machine.paths.unit_file(UNIT_A).exists()
    assert UNIT_B in machine.systemd.enabled() and UNIT_A not in machine.systemd.enabled()
    assert machine.systemd.state(OTHER).active == "inactive"  # the switch held: left stopped
    assert not machine.paths.journal.exists()
    assert healthy(before.port) is False  # tiny-a stays stopped: the new experiment serves


def test_a_running_switch_is_not_mistaken_for_a_killed_one(
    cli, experiment: Experiment, machine: Machine, serving_a: tuple[Path, Before]
) -> None:
    _spec_a, before = serving_a
    b = experiment("tiny-b", vllm="0.0.2", repo_id="org/tiny-b", revision=REV_B)
    proc = machine.spawn("apply", b, "--root", machine.root, "--yes", **{PAUSE_ENV: "current"})
    try:
        wait_until("the apply moved current", lambda: journal_step(machine) == "current")
        # the apply holds the state lock: listing works and leaves its journal alone
        r = cli("generations", "--root", machine.root)
        assert r.exit_code == 0 and "undid" not in r.stdout
        assert "a switch is in progress" in r.stderr
        assert journal_step(machine) == "current"
        r = cli("apply", "--recover", "--root", machine.root)
        assert r.exit_code == 3 and f"another envbuild (pid {proc.pid}, apply)" in r.stderr
        # SIGTERM is no kill: the apply undoes its own switch
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)
    assert proc.returncode == 143, err  # 128 + SIGTERM, its switch undone (before.holds)
    before.holds(machine)


def test_other_services_stay_stopped_and_rollback_yes_starts_them(
    cli, experiment: Experiment, machine: Machine, serving_a: tuple[Path, Before]
) -> None:
    _spec_a, before = serving_a
    b = experiment("tiny-b", vllm="0.0.2", repo_id="org/tiny-b", revision=REV_B)
    r = cli("apply", b, "--root", machine.root)
    assert r.exit_code == 3 and f"unit {OTHER}" in r.stdout  # it holds GPU memory: --yes
    r = cli("apply", b, "--root", machine.root, "--yes")
    assert r.exit_code == 0, r.stderr
    assert f"stopped: {UNIT_A}, {OTHER}" in r.stdout
    assert (
        f"left stopped: {OTHER} (not envbuild's units; they held GPU memory). "
        "`envbuild rollback --yes` starts them again"
    ) in r.stdout
    assert machine.systemd.state(OTHER).active == "inactive"
    last = json.loads(machine.paths.last_switch.read_text())
    assert last["others"] == [OTHER] and last["target"]["number"] == 2

    # rollback without --yes: back to tiny-a, and says the other service is still stopped
    r = cli("rollback", "--root", machine.root)
    assert r.exit_code == 0, r.stderr
    assert "current: generation 1 (was 2)" in r.stdout
    assert f"still stopped: {OTHER}" in r.stdout and f"systemctl start {OTHER}" in r.stdout
    assert machine.systemd.state(OTHER).active == "inactive"
    assert healthy(before.port)

    # again with the other service running; rollback --yes starts it again
    machine.systemd.start(OTHER)
    r = cli("apply", b, "--root", machine.root, "--yes", "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json()["switch"]["others_stopped"] == [OTHER]
    r = cli("rollback", "--root", machine.root, "--yes", "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json()["others_started"] == [OTHER] and r.json()["others_stopped"] == []
    before.holds(machine)
    # the rollback's own record leaves nothing to start again: rolling forward needs no --yes
    assert json.loads(machine.paths.last_switch.read_text())["others"] == []


def test_listing_works_where_a_journal_cannot_be_undone(cli, machine: Machine) -> None:
    """A user who may not take the state lock (here: the lock path is a folder) still gets the
    list, with a warning; apply --recover fails clearly."""
    machine.paths.state.mkdir(parents=True)
    machine.paths.guard_file.mkdir()
    machine.paths.journal.write_text("{}")
    r = cli("generations", "--root", machine.root)
    assert r.exit_code == 0 and "no generations under" in r.stdout
    assert "a switch was cut short, and is not undone: cannot open" in r.stderr
    r = cli("apply", "--recover", "--root", machine.root)
    assert r.exit_code == 2 and f"cannot open {machine.paths.guard_file}" in r.stderr
