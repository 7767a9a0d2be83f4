"""apply end to end on a --root: a real venv from a real lock, a real unit file (checked by
systemd-analyze), a model from the local hub, a fake systemd that really runs the unit, a real
switch between experiments and a rollback."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import urllib.request
from pathlib import Path

import pytest
from apply.conftest import REV_A, TOKEN, Experiment, Machine
from support.fakesystemd import UnitFile
from support.hfhub import Hub

from envbuild.apply import generations as gens
from envbuild.apply.unit import unit_name

pytestmark = pytest.mark.slow


def health(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
        return int(resp.status)


def port_of(spec: Path) -> int:
    for line in spec.read_text().splitlines():
        if line.startswith("port = "):
            return int(line.split("=")[1])
    raise AssertionError("no port in spec")


def fake_vllm_said(machine: Machine, unit: str) -> dict[str, object]:
    """The JSON line the fake vllm prints first when it starts (its argv and environment)."""
    lines = machine.systemd.logs(unit, 200).splitlines()
    return dict(json.loads(next(line for line in reversed(lines) if line.startswith("{"))))


def test_apply_builds_a_generation_and_serves(
    cli, experiment: Experiment, machine: Machine, hub: Hub
) -> None:
    spec = experiment("tiny-a")
    before = len(hub.requests)
    r = cli("apply", spec, "--root", machine.root, "--json")
    assert r.exit_code == 0, r.stderr
    out = r.json()
    assert out["preflight"]["ok"] and out["generation"] == 1 and not out["reused"]
    paths = machine.paths

    # current -> the generation, which is read-only and names its inputs
    cur = gens.current(paths)
    assert cur is not None and cur.number == 1
    assert os.readlink(paths.current) == f"generations/{cur.name}"
    assert cur.meta.spec_name == "tiny-a" and cur.meta.unit == "envbuild-tiny-a.service"
    assert (cur.path / "pylock.toml").read_text() == (
        spec.parent.parent / "lockfiles" / "pylock.tiny-a.toml"
    ).read_text()
    assert not os.stat(cur.venv / "bin" / "vllm").st_mode & 0o222
    assert not os.stat(cur.path).st_mode & 0o222

    # the venv holds exactly the lock: vllm and its dependency, nothing else (not even pip)
    assert cur.meta.packages == {"tinydep": "1.0", "vllm": "0.0.1"}
    site = next((cur.venv / "lib").glob("python3.*/site-packages"))
    assert sorted(p.name for p in site.glob("*.dist-info")) == [
        "tinydep-1.0.dist-info",
        "vllm-0.0.1.dist-info",
    ]

    # the unit: installed, pointing at the generation's venv, secrets only in the 0600 file
    unit = paths.unit_file("envbuild-tiny-a.service")
    text = unit.read_text()
    assert TOKEN not in text and "HF_TOKEN" not in text
    env_file = paths.env_file("tiny-a")
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    parsed = UnitFile.parse(unit)
    assert parsed.exec_start[0] == str(cur.venv / "bin" / "vllm")
    assert parsed.env_files == [env_file]
    analyze = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, check=False
    )
    assert analyze.returncode == 0 and analyze.stderr == "", analyze.stderr

    # vLLM got what the spec says, and answers on its port
    said = fake_vllm_said(machine, "envbuild-tiny-a.service")
    argv = said["argv"]
    assert isinstance(argv, list)
    assert argv[:3] == ["serve", "org/tiny-a", "--revision"] and argv[3] == REV_A
    for flag, value in [
        ("--tensor-parallel-size", "2"),
        ("--max-model-len", "4096"),
        ("--kv-cache-dtype", "fp8"),
        ("--gpu-memory-utilization", "0.85"),
        ("--tokenizer-revision", REV_A),
        ("--served-model-name", "tiny-a"),
    ]:
        assert argv[argv.index(flag) + 1] == value
    assert said["token_sha256"] == hashlib.sha256(TOKEN.encode()).hexdigest()
    assert said["extra_env"] == '100% of $HOME is "quoted"'
    assert said["hf_home"] == str(paths.hf_home) and said["offline"] == "1"
    assert health(port_of(spec)) == 200
    assert "envbuild-tiny-a.service" in machine.systemd.enabled()

    # the model: in the standard cache layout, only the files the spec asks for
    snap = paths.hf_hub_cache / "models--org--tiny-a" / "snapshots" / REV_A
    assert sorted(p.name for p in snap.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    assert (snap / "config.json").is_symlink()
    assert len([p for p in hub.requests[before:] if "/resolve/" in p[1] and p[0] == "GET"]) == 3

    # the snapshot beside the generation names the spec and lock it came from
    record = json.loads(cur.snapshot_file.read_text())
    assert record["spec"]["name"] == "tiny-a"
    assert record["spec"]["lock_sha256"] == cur.meta.lock_sha256
    assert record["gpu"]["driver_version"] == "590.48.01"
    assert [d["name"] for d in record["pythons"][0]["distributions"]] == ["tinydep", "vllm"]


def test_second_apply_changes_and_fetches_nothing(
    cli, experiment: Experiment, machine: Machine, hub: Hub
) -> None:
    spec = experiment("tiny-a")
    assert cli("apply", spec, "--root", machine.root).exit_code == 0
    pid = machine.systemd.running_pids()
    before = len(hub.requests)
    r = cli("apply", spec, "--root", machine.root, "--json")
    assert r.exit_code == 0, r.stderr
    out = r.json()
    assert out["reused"] and out["up_to_date"] and out["generation"] == 1
    assert out["model"]["fetched"] is False
    assert hub.requests[before:] == []  # not a single request to the hub
    assert machine.systemd.running_pids() == pid  # the service was not restarted
    assert [g.number for g in gens.list_generations(machine.paths)] == [1]


def test_switch_to_another_experiment_and_roll_back(
    cli, experiment: Experiment, machine: Machine
) -> None:
    a = experiment("tiny-a")
    b = experiment("tiny-b", vllm="0.0.2", repo_id="org/tiny-b", revision="b" * 40)
    assert cli("apply", a, "--root", machine.root).exit_code == 0
    unit_a, unit_b = unit_name("tiny-a"), unit_name("tiny-b")

    # without --yes, the running unit (which holds GPU memory) is not stopped: nothing changes
    r = cli("apply", b, "--root", machine.root)
    assert r.exit_code == 3
    assert "FAIL  units" in r.stdout and unit_a in r.stdout and "--yes" in r.stdout
    # the old vLLM's GPU memory is named with its process and unit
    pid = machine.systemd.running_pids()[0]
    assert f"held by pid {pid} (vllm) 100.0 GiB on GPU 0, unit {unit_a}" in r.stdout
    assert gens.current(machine.paths).number == 1  # type: ignore[union-attr]
    assert [g.number for g in gens.list_generations(machine.paths)] == [1]

    r = cli("apply", b, "--root", machine.root, "--yes")
    assert r.exit_code == 0, r.stderr
    assert f"stopped: {unit_a}" in r.stdout
    cur = gens.current(machine.paths)
    assert cur is not None and cur.number == 2 and cur.meta.packages["vllm"] == "0.0.2"
    assert machine.systemd.state(unit_a).active == "inactive"
    assert not machine.paths.unit_file(unit_a).exists()  # the old experiment's unit is retired
    assert health(port_of(b)) == 200
    assert fake_vllm_said(machine, unit_b)["vllm"] == "0.0.2"

    r = cli("generations", "--root", machine.root, "--json")
    listed = r.json()["generations"]
    assert [(g["number"], g["spec"], g["current"]) for g in listed] == [
        (1, "tiny-a", False),
        (2, "tiny-b", True),
    ]
    text = cli("generations", "--root", machine.root).stdout
    assert text.splitlines()[1].startswith("*   2 ") and "tiny-b" in text

    r = cli("rollback", "--root", machine.root)
    assert r.exit_code == 0, r.stderr
    assert "current: generation 1 (was 2)" in r.stdout
    assert gens.current(machine.paths).number == 1  # type: ignore[union-attr]
    assert machine.systemd.state(unit_b).active == "inactive"
    assert not machine.paths.unit_file(unit_b).exists()
    assert health(port_of(a)) == 200
    assert fake_vllm_said(machine, unit_a)["vllm"] == "0.0.1"

    # gc keeps the current generation whatever --keep says
    second = gens.list_generations(machine.paths)[-1]
    r = cli("generations", "--root", machine.root, "--gc", "--keep", "0", "--json")
    assert r.exit_code == 0
    assert r.json()["removed"] == [second.name]
    assert not second.path.exists() and not second.snapshot_file.exists()
    assert [g.number for g in gens.list_generations(machine.paths)] == [1]
    assert health(port_of(a)) == 200


def test_render_unit_shows_the_unit_apply_installs(
    cli, experiment: Experiment, machine: Machine, hub: Hub, tmp_path: Path
) -> None:
    spec = experiment("tiny-a")
    shown = tmp_path / "shown.service"
    r = cli("render", "unit", spec, "--root", machine.root, "-o", shown)
    assert r.exit_code == 0, r.stderr
    assert "EnvironmentFile" in r.stderr and "holds HF_TOKEN" in r.stderr
    assert TOKEN not in r.stderr and TOKEN not in shown.read_text()
    j = cli("render", "unit", spec, "--root", machine.root, "--json").json()
    assert j["text"] == shown.read_text() and j["env_keys"] == ["HF_TOKEN"] and j["exact_path"]
    assert j["generation"] == 1 and not j["reused"]
    assert cli("apply", spec, "--root", machine.root).exit_code == 0
    installed = machine.paths.unit_file("envbuild-tiny-a.service").read_text()
    assert installed == shown.read_text()
    # with generations made since, it shows what apply does: reuse generation 1, not a "3-…"
    assert cli("apply", experiment("tiny-b"), "--root", machine.root, "--yes").exit_code == 0
    r = cli("render", "unit", spec, "--root", machine.root, "--json")
    j = r.json()
    assert (j["generation"], j["reused"], j["text"]) == (1, True, installed), j["generation"]
    assert "apply reuses generation 1" in cli("render", "unit", spec, "--root", machine.root).stderr
