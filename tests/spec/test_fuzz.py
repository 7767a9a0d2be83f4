"""Whatever a spec file holds, ``envbuild validate`` answers 0 or 2 with located problems:
never a traceback, never an internal error. Random bytes, random TOML documents, and the seed
spec with one value swapped for a random one."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envbuild.errors import ExitCode

REPO = Path(__file__).resolve().parent.parent.parent
SEED = (REPO / "specs" / "glm5-gguf.toml").read_text("utf-8")
BASE = (REPO / "specs" / "base" / "rtx-pro-6000-8x.toml").read_text("utf-8")
PATCH = REPO / "specs" / "patches" / "vllm-glm-moe-dsa-fp8-kv-sm120.patch"

FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Keys that occur in specs, so random documents reach past "unknown key" into the checks.
KEYS = [
    "extends", "name", "host", "driver", "gpus", "model", "count", "compute_capability",
    "memory_gib", "cuda", "version", "base", "kind", "suite", "packages", "python", "platform",
    "torch", "index", "vllm", "extras", "builds", "flash-attn", "env", "patches", "repo",
    "revision", "size_gb", "serve", "tensor_parallel_size", "kv_cache_dtype", "resolution",
    "exclude_newer", "HF_TOKEN", "TORCH_CUDA_ARCH_LIST", "FLASH_ATTN_CUDA_ARCHS",
]  # fmt: skip
scalars = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["13.1", "590.48.01", "cu130", "12.0", "debian", "bookworm", "0.33.0",
                     "${HF_TOKEN}", "hf_" + "a" * 34, "../../x", "8.0;12.0+PTX", "0" * 40]),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True),
    st.booleans(),
    st.datetimes(max_value=datetime(9000, 1, 1), timezones=st.sampled_from([None, UTC])),
)  # fmt: skip
keys = st.one_of(st.sampled_from(KEYS), st.text(min_size=1, max_size=8))
documents = st.dictionaries(
    keys,
    st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=4)
        ),
        max_leaves=12,
    ),
    max_size=8,
)


def _repo(tmp_path: Path) -> Path:
    (tmp_path / ".git").mkdir(exist_ok=True)
    (tmp_path / "specs" / "base").mkdir(parents=True, exist_ok=True)
    (tmp_path / "specs" / "patches").mkdir(exist_ok=True)
    (tmp_path / "specs" / "base" / "rtx-pro-6000-8x.toml").write_text(BASE, "utf-8")
    (tmp_path / "specs" / "patches" / PATCH.name).write_bytes(PATCH.read_bytes())
    return tmp_path / "specs" / "fuzz.toml"


def _answers_cleanly(cli: Any, spec: Path) -> None:
    for args in (("validate", spec), ("validate", "--json", spec), ("show", spec)):
        result = cli(*args)
        assert result.exit_code in (ExitCode.OK, ExitCode.USER_ERROR), result.stderr
        assert "Traceback" not in result.stderr
        assert "internal error" not in result.stderr
        if result.exit_code == ExitCode.USER_ERROR and "--json" not in args:
            assert result.stderr.strip(), "an error must say what is wrong"


@FUZZ
@given(data=st.binary(max_size=300))
def test_random_bytes(cli, tmp_path, data):
    spec = _repo(tmp_path)
    spec.write_bytes(data)
    _answers_cleanly(cli, spec)


@FUZZ
@given(doc=documents)
def test_random_toml(cli, tmp_path, doc):
    spec = _repo(tmp_path)
    try:
        text = tomli_w.dumps(doc)
    except (TypeError, ValueError):  # e.g. a NaN or a naive time tomli-w refuses: not TOML
        text = repr(doc)
    spec.write_text(text, "utf-8")
    _answers_cleanly(cli, spec)


ASSIGNMENT = re.compile(r"^(\s*[A-Za-z0-9_.\"-]+\s*=\s*)(.+)$", re.MULTILINE)
SLOTS = list(ASSIGNMENT.finditer(SEED))


@FUZZ
@given(slot=st.sampled_from(range(len(SLOTS))), value=scalars)
def test_seed_with_one_value_swapped(cli, tmp_path, slot, value):
    spec = _repo(tmp_path)
    try:
        literal = tomli_w.dumps({"v": value}).split("=", 1)[1].strip()
    except (TypeError, ValueError):
        literal = "nan"
    m = SLOTS[slot]
    spec.write_text(SEED[: m.start(2)] + literal + SEED[m.end(2) :], "utf-8")
    _answers_cleanly(cli, spec)
