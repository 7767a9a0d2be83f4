"""The committed JSON schema is current; the seed specs validate; ``envbuild show`` prints the
merged spec."""

from __future__ import annotations

import json
import re
import tomllib
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from envbuild.errors import ExitCode, Severity
from envbuild.spec import knowledge as kb
from envbuild.spec.model import Spec
from envbuild.spec.validate import validate
from spec.regen import SCHEMA, schema_text

REPO = Path(__file__).resolve().parent.parent.parent
SEEDS = sorted((REPO / "specs").glob("*.toml"))
BLACKWELL_SEEDS = ["glm5-gguf", "kimi-k25-int4", "kimi-nvfp4", "minimax-m25-fp8"]
#: the placeholder revisions the seeds carry (offline, no commit shas could be read)
PLACEHOLDER_KEYS = {"model.revision", "model.tokenizer.revision", "model.config.revision"}


def test_schema_is_current():
    assert SCHEMA.read_text("utf-8") == schema_text(), (
        "schema/spec.schema.json is stale: run python -m tests.spec.regen"
    )
    schema = json.loads(SCHEMA.read_text("utf-8"))
    assert schema["additionalProperties"] is False
    assert {"base", "python", "resolution"} <= set(schema["required"])


def test_the_seed_specs_exist():
    assert {p.stem for p in SEEDS} >= set(BLACKWELL_SEEDS)


@pytest.mark.parametrize("path", SEEDS, ids=lambda p: p.stem)
def test_seed_spec_validates(path):
    report = validate(path)
    assert all(p.severity is Severity.WARNING for p in report.warnings)
    # The only warnings the seeds may carry: the unverified model revisions.
    assert {p.key for p in report.warnings} <= PLACEHOLDER_KEYS


@pytest.mark.parametrize("name", BLACKWELL_SEEDS)
def test_blackwell_seeds_share_the_base(name):
    loaded = validate(REPO / "specs" / f"{name}.toml").loaded
    spec = loaded.spec
    assert [loaded.display(f) for f in loaded.files][1:] == ["specs/base/rtx-pro-6000-8x.toml"]
    assert spec.host is not None and spec.cuda is not None and spec.torch is not None
    assert spec.cuda.version == "13.1"
    assert [(g.model, g.count) for g in spec.host.gpus] == [
        ("RTX PRO 6000 Blackwell Server Edition", 8)
    ]
    assert kb.target_platform(spec) == "manylinux_2_36_x86_64"
    assert spec.vllm is not None and kb.vllm_torch(spec.vllm.version) == spec.torch.version
    assert spec.serve is not None and spec.serve.env["HF_TOKEN"] == "${HF_TOKEN}"
    assert ("serve.env.HF_TOKEN", "HF_TOKEN") in spec.secret_refs()


def test_glm5_declares_the_gguf_plugin_flash_attn_and_a_real_patch():
    loaded = validate(REPO / "specs" / "glm5-gguf.toml").loaded
    spec = loaded.spec
    assert spec.vllm is not None and "extra-quant" in spec.vllm.extras
    env = spec.builds["flash-attn"].env
    assert env["FLASH_ATTN_CUDA_ARCHS"] == "120" and env["TORCH_CUDA_ARCH_LIST"] == "12.0"
    assert env["FLASH_ATTENTION_FORCE_BUILD"] == "TRUE" and "NVCC_THREADS" in env
    (patch,) = loaded.patch_files()["vllm"]
    text = patch.read_text("utf-8")
    assert "--- a/vllm/" in text and "+++ b/vllm/" in text and "\n@@ " in text


def test_show_prints_the_merged_spec(cli, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_NOTtoBEprintedNOTtoBEprinted1234")
    monkeypatch.chdir(REPO)
    typed = str(REPO / "specs" / "kimi-nvfp4.toml")  # named as typed; its base under the cwd
    result = cli("show", typed)
    assert result.exit_code == ExitCode.OK, result.stderr
    head, _, body = result.stdout.partition("\n# spec hash: ")
    assert f"# {typed} (merged from {typed}, specs/base/rtx-pro-6000-8x.toml)" in head
    shown = tomllib.loads(body.split("\n", 1)[1])
    # What show prints is the merged spec: it validates as one file, base keys included.
    spec = Spec.model_validate(shown)
    assert spec.host is not None and spec.host.driver == "590.48.01"
    assert spec.model is not None and spec.model.repo == "nvidia/Kimi-K2.5-NVFP4"
    assert shown["serve"]["env"]["HF_TOKEN"] == "${HF_TOKEN}"
    assert "NOTtoBE" not in result.stdout

    as_json = cli("show", "--json", typed)
    data = as_json.json()
    assert data["spec"] == spec.model_dump(mode="json") | {
        k: v for k, v in data["spec"].items() if v is None
    }
    assert data["files"] == [typed, "specs/base/rtx-pro-6000-8x.toml"]
    assert data["spec_hash"] in result.stdout


def test_show_of_a_bad_spec_is_a_located_error(cli, tmp_path):
    (tmp_path / ".git").mkdir()
    bad = tmp_path / "bad.toml"
    bad.write_text('[python]\nversion = "3.11"\nplatfrom = "x"\n')
    result = cli("show", bad)
    assert result.exit_code == ExitCode.USER_ERROR
    assert "bad.toml:3: python.platfrom: error: unknown key (fix: did you mean `platform`?)" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr


def test_the_annotated_spec_in_the_docs_validates(tmp_path):
    doc = (REPO / "docs" / "spec.md").read_text("utf-8")
    text = doc.split("```toml\n", 1)[1].split("```", 1)[0]
    (tmp_path / ".git").mkdir()
    specs = tmp_path / "specs"
    for rel in ("base/rtx-pro-6000-8x.toml", "patches/vllm-glm-moe-dsa-fp8-kv-sm120.patch"):
        (specs / rel).parent.mkdir(parents=True, exist_ok=True)
        (specs / rel).write_bytes((REPO / "specs" / rel).read_bytes())
    (specs / "annotated.toml").write_text(text, "utf-8")
    report = validate(specs / "annotated.toml")
    assert {p.key for p in report.warnings} <= PLACEHOLDER_KEYS
    documented = set(re.findall(r"^\[+([a-z_.-]+)\]+", text, re.MULTILINE))
    assert {"host", "host.gpus", "cuda", "base", "python", "torch", "vllm", "model"} <= documented
    assert {"serve", "serve.env", "image", "resolution", "patches", "packages"} <= documented


def test_the_docs_name_every_key_of_the_spec():
    doc = (REPO / "docs" / "spec.md").read_text("utf-8")
    names: set[str] = set()
    pending: list[Any] = [Spec]
    while pending:
        model = pending.pop()
        for field_name, info in model.model_fields.items():
            names.add(field_name)
            for arg in typing.get_args(info.annotation) or (info.annotation,):
                for inner in typing.get_args(arg) or (arg,):
                    if isinstance(inner, type) and issubclass(inner, BaseModel):
                        pending.append(inner)
    missing = sorted(n for n in names if not re.search(rf"\b{re.escape(n)}\b", doc))
    assert not missing, f"docs/spec.md does not describe {missing}"
