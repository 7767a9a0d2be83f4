"""A secret flag's value in serve.extra_args (``--api-key ${VLLM_API_KEY}``) reaches vLLM through
the unit's EnvironmentFile: systemd expands it in ExecStart, the unit file names only the
variable, and `systemd-analyze verify` accepts the unit."""

from __future__ import annotations

from pathlib import Path

from apply.conftest import Experiment
from apply.test_unit import render, verify
from support.fakesystemd import read_env_file

from envbuild.apply import unit as units
from envbuild.spec import load_spec

KEY = "sk-not-to-be-written-into-the-unit-0123"


def test_a_secret_flag_is_filled_in_by_systemd(experiment: Experiment, tmp_path: Path) -> None:
    extra = ("--api-key", "${VLLM_API_KEY}", "--trust-remote-code")
    spec = load_spec(experiment("tiny-a", extra=extra, lock=False)).spec
    path, _settings = render(spec, tmp_path)
    text = path.read_text()
    exec_line = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    assert ' --api-key "${VLLM_API_KEY}" --trust-remote-code' in exec_line
    assert "$${VLLM_API_KEY}" not in text and KEY not in text
    result = verify(path)
    assert result.returncode == 0 and result.stderr == "", result.stderr

    assert units.secret_names(spec) == ["HF_TOKEN", "VLLM_API_KEY"]
    env_file = tmp_path / "tiny-a.env"
    env_file.write_text(units.render_env_file(spec, {"HF_TOKEN": "hf", "VLLM_API_KEY": KEY}))
    assert read_env_file(env_file) == {"HF_TOKEN": "hf", "VLLM_API_KEY": KEY}
