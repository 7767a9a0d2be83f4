"""The vLLM unit and the secrets file: what systemd reads back is what the spec says, secrets
never appear in the unit, and every rendered unit passes `systemd-analyze verify`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from apply.conftest import Experiment
from support.fakesystemd import UnitFile, read_env_file, split_command

from envbuild.apply import unit as units
from envbuild.errors import EnvironmentFailure
from envbuild.spec import load_spec
from envbuild.spec.model import Spec

ODD_ARGS = (
    "--chat-template",
    '{% if messages %}a "b" {{ c }}{% endif %}',
    "--override-generation-config",
    '{"temperature": 0.6, "path": "$HOME\\\\x"}',
    "--tool-call-parser=kimi_k2",
)


def verify(unit: Path) -> subprocess.CompletedProcess[str]:
    """`systemd-analyze verify` on one unit file (works without a running systemd)."""
    return subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, check=False
    )


def render(spec: Spec, tmp_path: Path) -> tuple[Path, units.ServeSettings]:
    venv = tmp_path / "gen" / "venv"
    (venv / "bin").mkdir(parents=True)
    vllm = venv / "bin" / "vllm"
    vllm.write_text("#!/bin/sh\n")
    vllm.chmod(0o755)
    settings = units.ServeSettings(
        generation=7,
        generation_path=tmp_path / "gen",
        venv=venv,
        hf_home=tmp_path / "hf",
        env_file=tmp_path / "secrets" / f"{spec.name}.env",
    )
    path = tmp_path / units.unit_name(spec.name)
    path.write_text(units.render_unit(spec, "0" * 64, settings))
    return path, settings


def test_the_unit_reads_back_as_the_spec_says(experiment: Experiment, tmp_path: Path) -> None:
    spec = load_spec(experiment("tiny-a", extra=ODD_ARGS, lock=False)).spec
    path, settings = render(spec, tmp_path)
    result = verify(path)
    assert result.returncode == 0 and result.stderr == "", result.stderr

    parsed = UnitFile.parse(path)
    assert parsed.exec_start == units.exec_start(spec, settings.venv, settings.hf_home / "hub")
    assert parsed.exec_start[-len(ODD_ARGS) :] == list(ODD_ARGS)
    assert parsed.environment == {
        "FAKE_EXTRA": '100% of $HOME is "quoted"',
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        # bytecode beside the generations, never into one (a generation is its manifest)
        "PYTHONPYCACHEPREFIX": str(tmp_path.parent / "pycache"),
        "PYTHONUNBUFFERED": "1",
    }
    assert parsed.env_files == [settings.env_file]
    text = path.read_text()
    assert "HF_TOKEN" not in text  # the secret goes only to the EnvironmentFile
    for line in ("Restart=on-failure", "LimitNOFILE=1048576", "WantedBy=multi-user.target"):
        assert line in text.splitlines()


def test_the_check_fails_on_a_broken_unit(experiment: Experiment, tmp_path: Path) -> None:
    spec = load_spec(experiment("tiny-a", lock=False)).spec
    path, settings = render(spec, tmp_path)
    (settings.venv / "bin" / "vllm").unlink()
    result = verify(path)
    assert result.returncode != 0 and "is not executable" in result.stderr


def test_secrets_round_trip_through_the_environment_file(
    experiment: Experiment, tmp_path: Path
) -> None:
    spec = load_spec(experiment("tiny-a", lock=False)).spec
    secret = 'p@ss "word" with $VAR, `tick` and \\ backslash'
    text = units.render_env_file(spec, {"HF_TOKEN": secret})
    assert text.startswith("# Secrets for envbuild-tiny-a.service")
    env_file = tmp_path / "tiny-a.env"
    env_file.write_text(text)
    assert read_env_file(env_file) == {"HF_TOKEN": secret}


def test_missing_or_unwritable_secrets_are_refused(experiment: Experiment) -> None:
    spec = load_spec(experiment("tiny-a", lock=False)).spec
    with pytest.raises(EnvironmentFailure, match="need HF_TOKEN in the environment"):
        units.render_env_file(spec, {})
    with pytest.raises(EnvironmentFailure, match="newline"):
        units.render_env_file(spec, {"HF_TOKEN": "two\nlines"})


def test_systemd_quoting() -> None:
    for arg in ["plain", "a b", '"q"', "100%", "$HOME", "back\\slash", "tab\there", ""]:
        assert split_command(units.quote_arg(arg)) == [arg]
