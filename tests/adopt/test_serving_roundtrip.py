"""The serving half of the round trip, offline: a hand-built venv of the apply tests' fake vLLM
with its cli edited by hand, served by a hand-written unit → ``adopt --unit`` → ``lock --check``
→ ``apply --root`` on a machine with fake GPUs and a fake systemd that really runs the unit →
the unit envbuild rendered serves the same model, with the same flags, from the edited code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from adopt.conftest import make_venv, site_packages
from apply.conftest import REV_A, TOKEN, Index, Machine, free_port
from huggingface_hub import snapshot_download
from support import hfhub

from envbuild.apply import generations as gens

pytestmark = pytest.mark.slow


def test_adopt_a_served_venv_then_apply_it_and_it_serves(
    cli, repo: Path, tmp_path: Path, machine: Machine, wheel_index: Index, hub: hfhub.Hub,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    venv = make_venv(
        tmp_path / "tiny" / ".venv", "vllm==0.0.1", find_links=wheel_index.root / "files"
    )
    cli_py = site_packages(venv) / "vllm" / "cli.py"
    cli_py.write_text(
        cli_py.read_text().replace(
            "fake vllm {VERSION}: serving", "hand-fixed vllm {VERSION}: serving"
        )
    )
    port = free_port()
    unit = tmp_path / "vllm-tiny.service"
    unit.write_text(
        "[Service]\nEnvironment=HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz012345\n"
        f"ExecStart={venv}/bin/vllm serve org/tiny-a --revision {REV_A} "
        f"--tensor-parallel-size 2 --max-model-len 4096 --host 127.0.0.1 --port {port} "
        "--served-model-name tiny --enforce-eager\n"
    )
    # the hand-built machine's HF cache holds the model it serves: its size comes from there
    cache = tmp_path / "hf-hub"
    snapshot_download("org/tiny-a", revision=REV_A, cache_dir=cache, endpoint=hub.url)
    r = cli(
        "adopt", "--python", venv, "--unit", unit, "--index", f"{wheel_index.url}/simple",
        "--repo", repo, "--hf-cache", cache, "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    got = r.json()
    assert got["model"] == {"repo": "org/tiny-a", "revision": REV_A, "size_gb": 0.001}
    assert not any("Hugging Face cache" in n for n in got["notes"]), got["notes"]
    assert got["serve"] == {
        "tensor_parallel_size": 2,
        "max_model_len": 4096,
        "host": "127.0.0.1",
        "port": port,
        "served_model_name": "tiny",
        "extra_args": ["--enforce-eager"],
        "env": {"HF_TOKEN": "${HF_TOKEN}"},
    }
    assert [p["files"] for p in got["patches"]] == [["vllm/cli.py"]]
    spec = repo / "specs" / "tiny.toml"
    assert cli("lock", "--check", spec).exit_code == 0

    applied = cli("apply", spec, "--root", machine.root, "--json")
    assert applied.exit_code == 0, applied.stderr
    gen = gens.current(machine.paths)
    assert gen is not None and gen.meta.unit == "envbuild-tiny.service"
    logs = machine.systemd.logs("envbuild-tiny.service")
    said = json.loads(next(line for line in logs.splitlines() if line.startswith("{")))
    argv = said["argv"]
    assert argv[:4] == ["serve", "org/tiny-a", "--revision", REV_A]
    for flag, value in [("--tensor-parallel-size", "2"), ("--max-model-len", "4096"),
                        ("--port", str(port)), ("--served-model-name", "tiny")]:  # fmt: skip
        assert argv[argv.index(flag) + 1] == value
    assert "--enforce-eager" in argv
    assert "hand-fixed vllm 0.0.1: serving" in logs  # the hand edit, now a declared patch
