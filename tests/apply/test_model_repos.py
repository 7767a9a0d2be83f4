"""Every repo the unit reads is pinned and fetched: a tokenizer or config repo from the spec's
[model] is fetched at its own commit with the model (huggingface_hub's real client against the
tests' local hub), the unit names its snapshot folder, and glm5-gguf's unit names only files the
fetch put in the cache (the GGUF quant's first file, tokenizer and config from
Z.ai's repo)."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

from apply.conftest import REV_B, Experiment, Machine
from support.fakesystemd import UnitFile
from support.hfhub import Hub

from envbuild.apply import unit as units
from envbuild.apply.modelcache import fetch, find_cached, repo_folder
from envbuild.lock.core import lock_spec
from envbuild.spec import load_spec

REPO = Path(__file__).resolve().parent.parent.parent

AUX = f"""
[model.tokenizer]
repo = "org/tiny-b"
revision = "{REV_B}"
files = ["tokenizer.json"]

[model.config]
repo = "org/tiny-b"
revision = "{REV_B}"
files = ["config.json"]
"""


def test_apply_fetches_the_tokenizer_and_config_repos(
    cli, experiment: Experiment, machine: Machine, hub: Hub, monkeypatch
) -> None:
    spec = experiment("tiny-a", lock=False)
    spec.write_text(spec.read_text() + AUX)
    lock_spec(load_spec(spec))
    r = cli("apply", spec, "--root", machine.root, "--json")
    assert r.exit_code == 0, r.stderr
    out = r.json()
    assert [(m["repo"], m["revision"]) for m in out["repos"]] == [("org/tiny-b", REV_B)]
    snap = repo_folder(machine.paths.hf_hub_cache, "org/tiny-b") / "snapshots" / REV_B
    # both allow-pattern sets of the one repo, nothing else of it (not its weights)
    assert sorted(p.name for p in snap.iterdir()) == ["config.json", "tokenizer.json"]
    argv = UnitFile.parse(machine.paths.unit_file("envbuild-tiny-a.service")).exec_start
    assert argv[argv.index("--tokenizer") + 1] == str(snap)
    assert argv[argv.index("--hf-config-path") + 1] == str(snap)
    assert "--tokenizer-revision" not in argv  # the tokenizer is a folder, pinned by its path

    # offline (as the unit runs), the cache alone answers for every repo
    before = len(hub.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = cli("apply", spec, "--root", machine.root, "--json")
    assert r.exit_code == 0, r.stderr
    assert not r.json()["repos"][0]["fetched"] and len(hub.requests) == before


def test_glm5_gguf_fetches_every_repo_its_unit_names(hub: Hub, tmp_path: Path) -> None:
    loaded = load_spec(REPO / "specs" / "glm5-gguf.toml")
    spec = loaded.spec
    assert spec.model is not None and spec.model.gguf is not None
    gguf_rev, glm_rev = "1" * 40, "2" * 40
    shards = [f"UD-IQ2_XXS/GLM-5-UD-IQ2_XXS-0000{i}-of-00002.gguf" for i in (1, 2)]
    hub.add(
        "unsloth/GLM-5-GGUF",
        gguf_rev,
        {
            **{s: b"GGUF" + bytes(2000) for s in shards},
            "Q4_K_M/GLM-5-Q4_K_M-00001-of-00001.gguf": b"GGUF other quant, not fetched",
            "README.md": b"x",
        },
    )
    hub.add(
        "zai-org/GLM-5",
        glm_rev,
        {
            "config.json": json.dumps({"architectures": ["GlmMoeDsaForCausalLM"]}).encode(),
            "tokenizer.json": b'{"model": {}}',
            "tokenizer_config.json": b"{}",
            "chat_template.jinja": b"{{ messages }}",
            "model-00001-of-00282.safetensors": bytes(4096),  # the weights: never fetched
        },
    )
    assert spec.model.tokenizer is not None and spec.model.config is not None
    model = spec.model.model_copy(
        update={
            "revision": gguf_rev,
            "tokenizer": spec.model.tokenizer.model_copy(update={"revision": glm_rev}),
            "config": spec.model.config.model_copy(update={"revision": glm_rev}),
            # this hub's quant has two shards
            "gguf": spec.model.gguf.model_copy(update={"file": Path(shards[0]).name}),
        }
    )
    pinned = spec.model_copy(update={"model": model})
    cache = tmp_path / "hf" / "hub"
    repos = model.repos()
    assert [(r.repo, r.revision) for r in repos] == [
        ("unsloth/GLM-5-GGUF", gguf_rev),
        ("zai-org/GLM-5", glm_rev),
    ]
    results = [fetch(cache, r) for r in repos]
    assert all(r.fetched and r.verified for r in results)

    argv = units.exec_start(pinned, tmp_path / "venv", cache)
    # the quant's first file, which vllm-gguf-plugin knows by its path (the locked plugin's own
    # recognition of it: tests/apply/test_serving_checks.py), its shards beside it
    first = Path(argv[2])
    assert first.is_file() and first.name == Path(shards[0]).name
    gguf_dir = first.parent
    names = sorted(p.name for p in gguf_dir.iterdir())
    assert fnmatch.filter(names, "*-UD-IQ2_XXS-*.gguf") == [Path(s).name for s in shards]
    for flag in ("--tokenizer", "--hf-config-path"):
        folder = Path(argv[argv.index(flag) + 1])
        assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()
        assert not list(folder.glob("*.safetensors"))
    assert not {"--revision", "--tokenizer-revision", "--code-revision"} & set(argv)
    assert not (gguf_dir.parent / "Q4_K_M").exists()
    # the offline unit finds every one of them in the cache alone
    assert all(find_cached(cache, r) is not None for r in repos)
