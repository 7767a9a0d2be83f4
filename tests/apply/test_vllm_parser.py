"""The unit's command parsed by vLLM 0.33.0's real ``vllm serve`` parser (the probe apply runs in
the generation's venv): every seed spec's command parses, the mutations of extra_args that
validate refuses are refused (or, for a second --tensor-parallel-size, silently taken, which is
why validate refuses it), and the committed flag table is what the wheel's parser says.

The parser venv is the vLLM 0.33.0 wheel from PyPI installed without its dependencies, plus the
seed lock's small dependencies and a CPU torch (``tools/vllm_serve_flags.py venv``; scripts/test
builds it and sets ENVBUILD_VLLM_PARSER)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from envbuild.apply import unit as units
from envbuild.apply.servecheck import parse_commands, serve_args
from envbuild.spec import load_spec, serveflags

REPO = Path(__file__).resolve().parent.parent.parent
DEFAULT = Path.home() / ".cache" / "envbuild-tests" / "vllm-parser-0.33.0" / "bin" / "python"
PARSER = Path(os.environ.get("ENVBUILD_VLLM_PARSER") or DEFAULT)
SERVING = ["glm5-gguf", "kimi-k25-int4", "kimi-nvfp4", "minimax-m25-fp8"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not PARSER.exists(), reason=f"no vLLM 0.33.0 parser venv at {PARSER} (scripts/test)"
    ),
]


def _command(name: str, tmp_path: Path, extra: list[str] | None = None) -> list[str]:
    spec = load_spec(REPO / "specs" / f"{name}.toml").spec
    if extra is not None:
        assert spec.serve is not None
        serve = spec.serve.model_copy(update={"extra_args": [*spec.serve.extra_args, *extra]})
        spec = spec.model_copy(update={"serve": serve})
    venv = tmp_path / "generations" / "1-x" / "venv"
    return serve_args(units.exec_start(spec, venv, tmp_path / "hf" / "hub"))


MUTATIONS = [
    (["--max-modle-len", "4096"], False, "unrecognized arguments: --max-modle-len"),
    (["--tool-call-parser", "no_such_parser"], False, "invalid tool call parser: no_such_parser"),
    (["--dtype", "bf16"], False, "invalid choice: 'bf16'"),
    # taken by vLLM, the last one winning over the spec's 8: validate refuses it
    (["--tensor-parallel-size", "4"], True, None),
]


def test_every_seed_units_command_parses_and_the_mutations_do_not(tmp_path: Path) -> None:
    seeds = [_command(name, tmp_path) for name in SERVING]
    mutated = [_command("kimi-nvfp4", tmp_path, extra) for extra, _ok, _why in MUTATIONS]
    results = parse_commands(PARSER, [*seeds, *mutated])
    for name, result in zip(SERVING, results, strict=False):
        assert result.ok is True, (name, result.error)
    table = serveflags.table("0.33.0")
    assert table is not None
    for (extra, ok, why), result in zip(MUTATIONS, results[len(seeds) :], strict=True):
        assert result.ok is ok, (extra, result.error)
        if why is not None:
            assert why in (result.error or ""), result.error
        assert serveflags.check_args(table, ["--enable-auto-tool-choice", *extra]), extra


def test_the_committed_flag_table_is_what_the_wheels_parser_says(tmp_path: Path) -> None:
    if not (PARSER.parent.parent / "vllm-wheel.json").is_file():
        pytest.skip("the parser venv was not made by tools/vllm_serve_flags.py venv")
    out = tmp_path / "0.33.0.toml"
    subprocess.run(
        [sys.executable, str(REPO / "tools" / "vllm_serve_flags.py"), "table",
         "--python", str(PARSER), "-o", str(out)],
        check=True,
    )  # fmt: skip
    committed = REPO / "envbuild" / "spec" / "vllm_serve" / "0.33.0.toml"
    assert out.read_text() == committed.read_text(), (
        "envbuild/spec/vllm_serve/0.33.0.toml is stale: rerun tools/vllm_serve_flags.py table"
    )


def test_apply_refuses_a_command_its_generations_vllm_refuses(tmp_path: Path) -> None:
    from typing import cast

    from envbuild.apply import core
    from envbuild.apply.generations import Generation, GenerationMeta
    from envbuild.apply.paths import Paths
    from envbuild.errors import ExitCode, UserError

    gen_dir = tmp_path / "generations" / "3-x"
    gen_dir.mkdir(parents=True)
    (gen_dir / "venv").symlink_to(PARSER.parent.parent)  # a generation whose venv has vLLM
    generation = Generation(3, gen_dir, cast(GenerationMeta, None))
    spec = load_spec(REPO / "specs" / "kimi-nvfp4.toml").spec
    assert spec.serve is not None
    bad = spec.model_copy(
        update={"serve": spec.serve.model_copy(update={"extra_args": ["--max-modle-len", "1"]})}
    )
    with pytest.raises(UserError) as err:
        core._refuse_unparsable(generation, bad, Paths(tmp_path))
    assert err.value.exit_code == ExitCode.USER_ERROR
    assert "vLLM in generation 3 refuses the unit's command" in err.value.message
    assert "unrecognized arguments: --max-modle-len 1" in err.value.message
