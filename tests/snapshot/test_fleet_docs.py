"""docs/fleet.md's two ways of snapshotting N hosts, run against two rehearsal roots here: the
ssh loop (docs/fleet/snapshot-hosts.sh) with a stand-in ``ssh`` on PATH that runs the remote
command on this machine, and the Ansible playbook (docs/fleet/playbook.yml) with the real
ansible-playbook and ``ansible_connection=local`` hosts. Each root holds a copy of the same venv
as its current generation: the fleet is clean, then a file edited in one root is a row naming
that host. Neither applies a spec for real here: the stand-in `envbuild` records the apply
command line each host gets (checked: spec, root, before the snapshot) and runs every other
command."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from snapshot.conftest import later, site_packages

DOCS = Path(__file__).resolve().parents[2] / "docs" / "fleet"
EDITED = "alpha/models/llama.py"

# ssh HOST COMMAND… runs COMMAND here, as the remote shell would (options are skipped)
STAND_IN_SSH = """#!/bin/sh
while [ $# -gt 0 ]; do
    case $1 in -o|-p|-i|-l) shift 2 ;; -*) shift ;; *) break ;; esac
done
shift
exec sh -c "$*"
"""


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    """`envbuild` (this checkout's, run by this Python) and the stand-in `ssh`."""
    d = tmp_path / "bin"
    d.mkdir()
    (d / "envbuild").write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {d / "calls"}\n'
        'if [ "$1" = apply ]; then exit 0; fi  # recorded, not run (see the module docstring)\n'
        f'exec {sys.executable} -m envbuild "$@"\n'
    )
    (d / "ssh").write_text(STAND_IN_SSH)
    for tool in d.iterdir():
        tool.chmod(0o755)
    return d


def rehearsal_root(root: Path, base_venv: Path) -> Path:
    """A root whose current generation's venv is a copy of ``base_venv``."""
    generation = root / "var/lib/envbuild/generations/1-abc"
    generation.mkdir(parents=True)
    venv = generation / "venv"
    shutil.copytree(base_venv, venv, symlinks=True)
    cfg = venv / "pyvenv.cfg"
    cfg.write_text(cfg.read_text().replace(str(base_venv), str(venv)))
    (root / "var/lib/envbuild/current").symlink_to("generations/1-abc")
    return venv


def edit(venv: Path) -> None:
    path = site_packages(venv) / EDITED
    path.write_text(path.read_text().replace("x * 2", "x * 3"))
    later(path)


def run_env(bin_dir: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "ANSIBLE_NOCOLOR": "1"}


def assert_planted_row(table: str, snapshots: Path) -> None:
    """The edited file is one row: host2 has other bytes than host1."""
    assert EDITED in table, table
    row = table.splitlines()
    i = next(n for n, line in enumerate(row) if EDITED in line)
    values = row[i + 1 : i + 3]
    assert [v.split()[0] for v in values] == ["∅", "differs"], values  # ∅: as its RECORD says
    assert values[0].endswith(f"on {snapshots}/host1.json"), values
    assert "differs from RECORD" in values[1] and values[1].endswith(f"on {snapshots}/host2.json")


def applied_then_snapshotted(bin_dir: Path, roots: list[str]) -> None:
    """Each root got `apply SPEC --root ROOT --yes`, then its snapshot; then one verify."""
    calls = (bin_dir / "calls").read_text().splitlines()
    for root in roots:
        apply = calls.index(f"apply specs/exp.toml --root {root} --yes")
        venv = f"{root.rstrip('/')}/var/lib/envbuild/current/venv"
        snap = next(i for i, c in enumerate(calls) if c.startswith(f"snapshot --python {venv} "))
        assert apply < snap, calls
    assert len(calls) == 2 * len(roots) + 1 and calls[-1].startswith("verify --fleet "), calls
    (bin_dir / "calls").unlink()


def test_the_ssh_loop(tmp_path: Path, base_venv: Path, bin_dir: Path) -> None:
    venvs = [rehearsal_root(tmp_path / f"root{i}", base_venv) for i in (1, 2)]
    hosts = tmp_path / "hosts"
    # a comment, a root with a trailing slash, and no newline after the last line
    hosts.write_text(f"# name root\nhost1 {tmp_path / 'root1'}\nhost2 {tmp_path / 'root2'}/")
    out = tmp_path / "snapshots"
    env = {**run_env(bin_dir), "SNAPSHOT_ARGS": "--no-docker --no-systemd"}

    def loop(*spec: str) -> subprocess.CompletedProcess[str]:
        argv = [str(DOCS / "snapshot-hosts.sh"), str(hosts), str(out), *spec]
        return subprocess.run(
            argv, check=False, env=env, capture_output=True, text=True, timeout=300
        )

    clean = loop("specs/exp.toml")
    assert clean.returncode == 0, clean.stderr
    applied_then_snapshotted(bin_dir, [f"{tmp_path}/root1", f"{tmp_path}/root2/"])
    assert "no difference across 2 machines" in clean.stdout
    assert sorted(p.name for p in out.iterdir()) == ["host1.json", "host2.json"]
    edit(venvs[1])
    drifted = loop()
    assert drifted.returncode == 1, drifted.stderr
    assert_planted_row(drifted.stdout, out)


def ansible_playbook() -> str:
    """ansible-playbook beside this Python (the [test] extras install ansible-core)."""
    found = Path(sys.executable).parent / "ansible-playbook"
    if not found.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{found} is missing; CI must have ansible-core", pytrace=False)
        pytest.skip("ansible-core is not installed (pip install ansible-core)")
    return str(found)


def test_the_playbook(tmp_path: Path, base_venv: Path, bin_dir: Path) -> None:
    playbook = ansible_playbook()
    venvs = [rehearsal_root(tmp_path / f"root{i}", base_venv) for i in (1, 2)]
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(
        "[serving]\n"
        + "".join(
            f"host{i} envbuild_root={tmp_path / f'root{i}'} "
            f"envbuild_remote_snapshot={tmp_path / f'root{i}'}/snapshot.json\n"
            for i in (1, 2)
        )
        + f"[serving:vars]\nansible_connection=local\nansible_python_interpreter={sys.executable}\n"
    )
    out = tmp_path / "snapshots"
    env = {**run_env(bin_dir), "ANSIBLE_HOME": str(tmp_path / "ansible-home")}
    env["ANSIBLE_LOCAL_TEMP"] = str(tmp_path / "ansible-tmp")

    def play(*extra: str) -> subprocess.CompletedProcess[str]:
        argv = [
            playbook, "-i", str(inventory), str(DOCS / "playbook.yml"),
            "-e", f"envbuild_fetch_to={out}",
            "-e", '{"envbuild_snapshot_args": ["--no-docker", "--no-systemd"]}', *extra,
        ]  # fmt: skip
        return subprocess.run(
            argv, check=False, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path
        )

    clean = play("-e", "envbuild_fleet_must_match=true", "-e", "envbuild_spec=specs/exp.toml")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    applied_then_snapshotted(bin_dir, [f"{tmp_path}/root1", f"{tmp_path}/root2"])
    assert "no difference across 2 machines" in (out / "fleet.txt").read_text()
    edit(venvs[1])
    drifted = play()
    assert drifted.returncode == 0, drifted.stdout + drifted.stderr  # a difference is no failure
    assert_planted_row((out / "fleet.txt").read_text(), out)
    strict = play("-e", "envbuild_fleet_must_match=true")
    assert strict.returncode != 0 and "the machines differ" in strict.stdout
