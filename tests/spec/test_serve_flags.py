"""``serve.extra_args`` against vLLM's serve flags: the table is the one extracted from the vLLM
wheel (envbuild/spec/vllm_serve/), each mutation of a seed spec's extra_args is refused by
validate with the key and a fix, and the seed specs' own extra_args pass."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import tomli_w
from hypothesis import given, settings
from hypothesis import strategies as st

from envbuild.errors import Severity, SpecError
from envbuild.spec import serveflags
from envbuild.spec.validate import validate

REPO = Path(__file__).resolve().parent.parent.parent
GLM5_ARGS = ["--trust-remote-code", "--enable-auto-tool-choice"]

#: (extra_args, the index validate names, words the message holds, words the fix holds)
MUTATIONS = [
    (["--max-modle-len", "4096"], 0, "no flag --max-modle-len", "--max-model-len"),
    (
        ["--tensor-parallel-size", "4"],
        0,
        "serve.tensor_parallel_size",
        "serve.tensor_parallel_size",
    ),
    (["-tp", "4"], 0, "serve.tensor_parallel_size", "drop -tp"),
    (["--tensor_parallel_size=4"], 0, "serve.tensor_parallel_size", "drop"),
    (
        ["--tool-call-parser", "no_such_parser"],
        0,
        "no 'no_such_parser' for --tool-call-parser",
        "one of",
    ),
    (["--tool-call-parser", "glm_47"], 0, "'glm_47'", "'glm47'"),
    (["--reasoning-parser", "glm4"], 0, "--reasoning-parser", "did you mean"),
    (["--dtype", "bf16"], 0, "no 'bf16' for --dtype", "one of"),
    (["--max-model-len", "4096"], 0, "serve.max_model_len", "serve.max_model_len"),
    (["--kv-cache-dtype=fp8"], 0, "serve.kv_cache_dtype", "serve.kv_cache_dtype"),
    (["--port", "9000"], 0, "serve.port", "serve.port"),
    (["--gpu-memory-utilization", "0.5"], 0, "serve.gpu_memory_utilization", "drop"),
    (["--tokenizer", "zai-org/GLM-5"], 0, "model.tokenizer", "model.tokenizer"),
    (["--hf-config-path", "zai-org/GLM-5"], 0, "model.config", "model.config"),
    (["--revision", "main"], 0, "model.revision", "model.revision"),
    (["--model", "other/model"], 0, "model.repo", "model.repo"),
    (["other/model"], 0, "not a flag", "drop it"),
    (["--enable-chunked-prefill", "--enable-chunked-prefill"], 1, "twice", "keep one"),
    (["--max-num-seqs"], 0, "needs a value", "--max-num-seqs VALUE"),
    (["--enforce-eager=yes"], 0, "takes no value", "alone"),
    (["--max-num-se", "8"], 0, "abbreviates --max-num-seqs", "in full"),
    (["--", "--foo"], 0, "'--' ends", "drop it"),
]


def _spec(tmp_path: Path, extra: list[str]) -> Path:
    """glm5-gguf (GGUF, tokenizer and config repos) with other extra_args, in a copy of specs/."""
    shutil.copytree(REPO / "specs", tmp_path / "specs")
    (tmp_path / ".git").mkdir()
    path = tmp_path / "specs" / "glm5-gguf.toml"
    text = path.read_text("utf-8")
    start = text.index("extra_args = [")
    end = text.index("]\n", start) + 2
    path.write_text(text[:start] + tomli_w.dumps({"extra_args": extra}) + text[end:], "utf-8")
    return path


def test_the_table_is_vllm_033s_and_every_entry_has_its_source() -> None:
    table = serveflags.table("0.33.0")
    assert table is not None and table.vllm == "0.33.0"
    assert "vllm-0.33.0-" in table.source and re.search(r"sha256 [0-9a-f]{64}", table.source)
    assert all(f.source for f in table.flags) and all(c.source for c in table.value_checks)
    assert table.by_name["-tp"].dest == "tensor_parallel_size"
    assert table.by_name["--tensor-parallel-size"].owned_by == "serve.tensor_parallel_size"
    assert "glm47" in {c.dest: c for c in table.value_checks}["tool_call_parser"].choices
    assert table.by_name["--dtype"].choices and "bfloat16" in table.by_name["--dtype"].choices
    assert [p.name for p in table.plugins] == ["vllm-gguf-plugin"]
    assert serveflags.table("0.0.1") is None


def test_the_seed_specs_extra_args_pass() -> None:
    table = serveflags.table("0.33.0")
    assert table is not None
    for path in sorted((REPO / "specs").glob("*.toml")):
        report = validate(path)
        assert not [p for p in report.warnings if p.key.startswith("serve.extra_args")], path


@pytest.mark.parametrize(("extra", "index", "message", "fix"), MUTATIONS, ids=lambda v: str(v))
def test_validate_refuses_each_mutation(
    tmp_path: Path, extra: list[str], index: int, message: str, fix: str
) -> None:
    path = _spec(tmp_path, [*GLM5_ARGS, *extra])
    with pytest.raises(SpecError) as err:
        validate(path)
    want = f"serve.extra_args[{len(GLM5_ARGS) + index}]"
    found = [p for p in err.value.problems if p.key == want and p.severity is Severity.ERROR]
    assert found, [p.render() for p in err.value.problems]
    assert any(message in p.message and fix in (p.hint or "") for p in found), found
    assert found[0].line is not None and found[0].file == str(path)


def test_a_plugin_parser_is_not_checked_against_the_builtin_ones() -> None:
    table = serveflags.table("0.33.0")
    assert table is not None
    args = ["--tool-parser-plugin", "my_parser.py", "--tool-call-parser", "mine"]
    assert serveflags.check_args(table, args) == []
    assert serveflags.check_args(table, ["--reasoning-parser", "none", "-O3"]) == []
    assert serveflags.check_args(table, ["--compilation-config.mode", "3"]) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=12) | st.sampled_from(["--dtype", "-tp", "--", "=", "-"])))
def test_any_argument_list_gives_problems_not_a_traceback(args: list[str]) -> None:
    table = serveflags.table("0.33.0")
    assert table is not None
    for problem in serveflags.check_args(table, args):
        assert 0 <= problem.index < len(args) and problem.message and problem.fix


def test_a_gguf_repo_served_by_its_repo_id_is_named(tmp_path: Path) -> None:
    path = _spec(tmp_path, GLM5_ARGS)
    text = path.read_text("utf-8")
    start = text.index("[model.gguf]")
    end = text.index("[model.tokenizer]", start)
    path.write_text(text[:start] + text[end:], "utf-8")
    report = validate(path)
    [found] = [p for p in report.warnings if p.key == "model.repo"]
    assert "by its repo id" in found.message and "repo:QUANT" in found.message
    assert "[model.gguf]" in (found.hint or "")
