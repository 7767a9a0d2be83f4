"""A half-finished apply leaves the previous generation active and its unit as it was: a unit
that never gets healthy (the switch is undone), an apply killed while uv builds the venv, a
SIGTERM during the switch. Two applies at once: the second waits or refuses."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from apply.conftest import Experiment, Index, Machine
from support import heldproxy

from envbuild.apply import generations as gens
from envbuild.apply.unit import unit_name

pytestmark = pytest.mark.slow

UNIT_A = unit_name("tiny-a")


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False


def port_of(spec: Path) -> int:
    line = next(x for x in spec.read_text().splitlines() if x.startswith("port = "))
    return int(line.split("=")[1])


@pytest.fixture
def serving_a(cli, experiment: Experiment, machine: Machine) -> Path:
    """tiny-a applied: generation 1 current, its unit running and healthy."""
    spec = experiment("tiny-a")
    assert cli("apply", spec, "--root", machine.root).exit_code == 0
    assert healthy(port_of(spec))
    return spec


def assert_still_a(machine: Machine, spec_a: Path) -> None:
    cur = gens.current(machine.paths)
    assert cur is not None and cur.number == 1
    assert machine.systemd.state(UNIT_A).active == "active"
    assert healthy(port_of(spec_a))
    assert "tiny-a" in machine.paths.unit_file(UNIT_A).read_text()


def test_a_unit_that_crashes_is_undone(
    cli, experiment: Experiment, machine: Machine, serving_a: Path
) -> None:
    crash = experiment("tiny-c", extra=("--fake-crash",))
    r = cli("apply", crash, "--root", machine.root, "--yes", "--health-timeout", "30")
    assert r.exit_code == 3
    assert "envbuild-tiny-c.service stopped before it became healthy" in r.stderr
    assert "fake vllm: crashing as asked" in r.stderr  # the unit's own last log lines
    assert f"restored: started {UNIT_A} again" in r.stderr
    assert_still_a(machine, serving_a)
    assert not machine.paths.unit_file("envbuild-tiny-c.service").exists()
    assert not machine.paths.env_file("tiny-c").exists()
    # the new generation was built completely; it is simply not current
    assert [g.number for g in gens.list_generations(machine.paths)] == [1, 2]


def test_a_unit_that_never_gets_healthy_times_out_and_is_undone(
    cli, experiment: Experiment, machine: Machine, serving_a: Path
) -> None:
    sick = experiment("tiny-a", extra=("--fake-unhealthy",), port=port_of(serving_a))
    r = cli("apply", sick, "--root", machine.root, "--yes", "--health-timeout", "3")
    assert r.exit_code == 3
    assert "did not become healthy within 3 s" in r.stderr and "HTTP 503" in r.stderr
    assert "fix:" not in r.stderr  # errors say "hint:", not preflight's "fix:"
    assert "raise --health-timeout" in r.stderr
    # same unit name: the old unit file and secrets are back, the old process serves again
    assert_still_a(machine, experiment("tiny-a", port=port_of(serving_a), lock=False))


@pytest.fixture
def held(wheel_index: Index) -> Iterator[heldproxy.Held]:
    with heldproxy.serve(wheel_index.url) as proxy:
        yield proxy


def wait_for(event_or_fn: object, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ok = event_or_fn.is_set() if hasattr(event_or_fn, "is_set") else event_or_fn()  # type: ignore[operator]
        if ok:
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {event_or_fn}")


def test_an_apply_killed_while_building_the_venv_changes_nothing(
    cli,
    experiment: Experiment,
    machine: Machine,
    serving_a: Path,
    held: heldproxy.Held,
    tmp_path: Path,
) -> None:
    other = experiment("tiny-k", vllm="0.0.2", index=held.url)
    held.hold = True
    proc = machine.spawn(
        "apply",
        other,
        "--root",
        machine.root,
        "--yes",
        UV_CACHE_DIR=str(tmp_path / "fresh-uv-cache"),
    )
    try:
        wait_for(held.arrived)  # uv is downloading a wheel of the new venv: mid-build
        assert proc.poll() is None
        building = list(machine.paths.generations.glob(".tmp-*"))
        assert len(building) == 1 and (building[0] / "venv").is_dir()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        held.release.set()
        proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert_still_a(machine, serving_a)
    assert [g.number for g in gens.list_generations(machine.paths)] == [1]

    # the next apply clears what the killed one left, and builds from scratch
    held.hold = False
    r = cli("apply", other, "--root", machine.root, "--yes")
    assert r.exit_code == 0, r.stderr
    assert not list(machine.paths.generations.glob(".tmp-*"))
    assert gens.current(machine.paths).number == 2  # type: ignore[union-attr]


def test_sigterm_during_the_health_wait_undoes_the_switch(
    cli, experiment: Experiment, machine: Machine, serving_a: Path
) -> None:
    sick = experiment("tiny-s", extra=("--fake-unhealthy",))
    proc = machine.spawn("apply", sick, "--root", machine.root, "--yes")
    try:
        wait_for(lambda: machine.systemd.state("envbuild-tiny-s.service").active == "active")
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, err  # 143: as a shell reports it
    assert "interrupted (SIGTERM)" in err
    assert_still_a(machine, serving_a)
    assert machine.systemd.state("envbuild-tiny-s.service").active == "inactive"


def test_two_applies_at_once(
    cli, experiment: Experiment, machine: Machine, held: heldproxy.Held, tmp_path: Path
) -> None:
    spec = experiment("tiny-k", vllm="0.0.2", index=held.url)
    held.hold = True
    cache = str(tmp_path / "fresh-uv-cache")
    first = machine.spawn("apply", spec, "--root", machine.root, UV_CACHE_DIR=cache)
    waiting = None
    try:
        wait_for(held.arrived)
        # a second apply refuses at once, naming the one that holds the state dir
        r = cli("apply", spec, "--root", machine.root)
        assert r.exit_code == 3
        assert f"another envbuild (pid {first.pid}, apply) is changing" in r.stderr
        assert "--wait" in r.stderr
        # with --wait it waits for the first, then finds the work done
        waiting = machine.spawn(
            "apply", spec, "--root", machine.root, "--wait", "120", "--json", UV_CACHE_DIR=cache
        )
        time.sleep(1.5)
        assert waiting.poll() is None
    finally:
        held.release.set()
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert waiting is not None
    out, err = waiting.communicate(timeout=120)
    assert waiting.returncode == 0, err
    assert "waiting up to 120 s for another envbuild" in err
    assert '"up_to_date": true' in out
    assert [g.number for g in gens.list_generations(machine.paths)] == [1]
    machine.systemd.stop_all()


def test_the_lock_file_names_nobody_once_free(machine: Machine) -> None:
    from envbuild.apply.stateguard import state_guard

    with state_guard(machine.paths):
        assert machine.paths.guard_file.read_text() == f"{os.getpid()} apply\n"
    assert machine.paths.guard_file.read_text() == ""
    subprocess.run(["true"], check=True)
