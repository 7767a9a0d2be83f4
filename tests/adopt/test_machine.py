"""The machine and its unit as spec tables: ``[host]`` from what a real H200's NVML answered,
``[serve]``/``[model]`` from a unit's ExecStart read with vLLM's own flags (the committed table
of vLLM 0.33.0, and the real parser of the vLLM 0.33.0 test venv where it exists)."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest
from adopt.conftest import make_venv, served
from support.recordednvml import FIXTURES, RecordedNvml
from support.wheels import make_wheel

from envbuild.adopt import Options, adopt, serving
from envbuild.adopt.specfile import read_unit
from envbuild.errors import SpecError
from envbuild.snapshot.model.core import load_snapshot
from envbuild.spec.model import Model, Serve
from envbuild.spec.serveflags import table
from envbuild.spec.validate import validate
from envbuild.store.core import Store

REV = "0123456789abcdef0123456789abcdef01234567"
HUB = "/var/lib/hf/hub"
FILE = "GLM-5-UD-IQ2_XXS-00001-of-00001.gguf"  # the quant's first file, as envbuild's unit names it
UNIT = f"""\
[Unit]
Description=GLM-5 by hand

[Service]
Environment=CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7
Environment=HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123
Environment=HF_HOME=/var/lib/hf
ExecStart=/opt/glm5/.venv/bin/vllm serve \\
    {HUB}/models--unsloth--GLM-5-GGUF/snapshots/{REV}/UD-IQ2_XXS/{FILE} \\
    -tp 8 --max-model-len 128k --kv-cache-dtype fp8 --gpu-memory-utilization 0.92 \\
    --served-model-name glm-5 --port 8000 --trust-remote-code --tool-call-parser glm47 \\
    --api-key sk-abcdefghijklmnopqrstuvwxyz0123456789
"""


def _unit(tmp_path: Path, tp: int = 8, hub: str = HUB) -> Path:
    path = tmp_path / "vllm-glm5.service"
    # systemd joins continued lines; the unit-file reader sees one ExecStart line
    text = UNIT.replace("\\\n    ", "").replace("-tp 8", f"-tp {tp}").replace(HUB, hub)
    path.write_text(text)
    return path


def _hf_cache(hub: Path) -> None:
    """A Hugging Face cache holding the GGUF snapshot the unit serves (2 MB of it)."""
    repo = hub / "models--unsloth--GLM-5-GGUF"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / ("e" * 64)).write_bytes(b"\0" * 2_000_000)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REV)
    folder = repo / "snapshots" / REV / "UD-IQ2_XXS"
    folder.mkdir(parents=True)
    (folder / "GLM-5-UD-IQ2_XXS-00001-of-00001.gguf").symlink_to(f"../../../blobs/{'e' * 64}")


def test_a_units_exec_start_becomes_serve_and_model(tmp_path: Path) -> None:
    argv, env = read_unit(str(_unit(tmp_path)))
    flags = table("0.33.0")
    assert flags is not None
    notes: list[str] = []
    got = serving.served(argv, env, flags, "the table", None, notes)
    assert got.serve == {
        "tensor_parallel_size": 8,
        "max_model_len": 128000,
        "kv_cache_dtype": "fp8",
        "gpu_memory_utilization": 0.92,
        "served_model_name": "glm-5",
        "port": 8000,
        "extra_args": [
            "--trust-remote-code", "--tool-call-parser", "glm47", "--api-key", "${VLLM_API_KEY}"
        ],
        "env": {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "HF_TOKEN": "${HF_TOKEN}"},
    }  # fmt: skip
    assert got.model == {
        "repo": "unsloth/GLM-5-GGUF",
        "revision": REV,
        "size_gb": 1.0,
        "gguf": {
            "quant": "UD-IQ2_XXS",
            "folder": "UD-IQ2_XXS",
            "file": "GLM-5-UD-IQ2_XXS-00001-of-00001.gguf",
        },
        "files": ["UD-IQ2_XXS/*"],
    }
    assert any("not in the Hugging Face cache" in n for n in notes)
    Serve.model_validate(got.serve)  # the spec's own models take them
    Model.model_validate(got.model)


def test_the_plugins_dir_quant_form_finds_its_first_file_in_the_cache(tmp_path: Path) -> None:
    """A hand-written unit may name the quant the plugin's other way (``<dir>:<quant>``): the
    quant's first file comes from the cached snapshot; without it adopt says so."""
    hub = tmp_path / "hf" / "hub"
    _hf_cache(hub)
    snapshot = hub / "models--unsloth--GLM-5-GGUF" / "snapshots" / REV / "UD-IQ2_XXS"
    notes: list[str] = []
    got = serving.model_of(f"{snapshot}:UD-IQ2_XXS", None, None, notes)
    assert got is not None
    assert got["gguf"] == {
        "quant": "UD-IQ2_XXS",
        "folder": "UD-IQ2_XXS",
        "file": "GLM-5-UD-IQ2_XXS-00001-of-00001.gguf",
    }
    Model.model_validate(got)
    notes = []
    gone = serving.model_of(
        f"{tmp_path}/models--a--b/snapshots/{REV}/Q4_K_M:Q4_K_M", None, None, notes
    )
    assert gone is not None and gone["gguf"]["file"] == ""
    assert any("no .gguf file of Q4_K_M" in n for n in notes)


def test_a_repo_id_with_a_revision_and_unknown_flags_kept(tmp_path: Path) -> None:
    flags = table("0.33.0")
    assert flags is not None
    argv = ["vllm", "serve", "org/model", "--revision", REV, "--tensor_parallel_size=2"]
    argv += ["--some-new-flag", "x", "--enforce-eager"]
    got = serving.served(argv, {}, flags, "t", None, [])
    assert got.model is not None and (got.model["repo"], got.model["revision"]) == (
        "org/model",
        REV,
    )
    assert got.serve["tensor_parallel_size"] == 2
    assert got.serve["extra_args"] == ["--some-new-flag", "x", "--enforce-eager"]
    with pytest.raises(Exception, match="not `vllm serve"):
        serving.served(["python", "-m", "x"], {}, flags, "t", None, [])


@pytest.mark.slow  # importing vLLM takes ~30 s
@pytest.mark.skipif(
    not os.environ.get("ENVBUILD_VLLM_PARSER"), reason="ENVBUILD_VLLM_PARSER is not set"
)
def test_the_flags_come_from_the_environments_own_vllm(tmp_path: Path) -> None:
    python = Path(os.environ["ENVBUILD_VLLM_PARSER"])
    notes: list[str] = []
    flags, source = serving.flag_table(python, "0.33.0", notes)
    assert source == "the parser of vLLM 0.33.0 in the environment", notes
    assert flags.by_name["-tp"].dest == "tensor_parallel_size"
    assert flags.by_name["--port"].owned_by == "serve.port"
    argv, env = read_unit(str(_unit(tmp_path)))
    got = serving.served(argv, env, flags, source, None, notes)
    assert got.serve["tensor_parallel_size"] == 8 and got.serve["port"] == 8000


def test_host_facts_from_a_real_h200_and_the_unit_into_a_spec_that_validates(
    repo: Path, tmp_path: Path
) -> None:
    wheels = [
        make_wheel(tmp_path / "w", "vllm", "0.33.0", {"vllm/__init__.py": ""}),
        make_wheel(tmp_path / "w", "vllm-gguf-plugin", "0.1.0", {"vllm_gguf/__init__.py": ""}),
    ]
    venv = make_venv(
        tmp_path / "glm5" / ".venv", "vllm", "vllm-gguf-plugin", find_links=tmp_path / "w"
    )
    nvml = RecordedNvml(FIXTURES / "h200-nvml-idle.json")
    with served(wheels, tmp_path / "ix") as url:
        # the recorded H200 machine has one GPU; the unit serves a snapshot of its own cache
        _hf_cache(tmp_path / "hf" / "hub")
        unit = str(_unit(tmp_path, tp=1, hub=str(tmp_path / "hf" / "hub")))
        opts = Options(str(venv), repo, unit=unit, index_url=url, nvml=nvml)
        opts.store = Store(tmp_path / "st")
        got = adopt(opts)
    assert got.name == "glm5"
    assert got.host == {
        "driver": "580.159.04",
        "gpus": [{"model": "H200", "count": 1, "compute_capability": "9.0"}],
    }
    assert got.flags_from and "0.33.0" in got.flags_from
    spec = tomllib.loads((repo / "specs" / "glm5.toml").read_text())
    assert spec["vllm"] == {"version": "0.33.0"} and spec["host"] == got.host
    assert spec["serve"]["tensor_parallel_size"] == 1
    assert spec["model"]["repo"] == "unsloth/GLM-5-GGUF"
    assert spec["model"]["size_gb"] == 0.002  # from the cache holding what the unit serves
    assert "sk-" not in (repo / "specs" / "glm5.toml").read_text()
    assert "hf_abc" not in (repo / "specs" / "glm5.toml").read_text()
    validate(repo / "specs" / "glm5.toml")


def test_cuda_and_base_from_a_snapshot() -> None:
    from envbuild.adopt import hostfacts

    snap = load_snapshot(FIXTURES / "h200-snapshot.json")
    notes: list[str] = []
    assert hostfacts.cuda_table(snap, notes) == {"version": "13.0", "source": "host"}
    assert hostfacts.base_table(snap, notes) == {"kind": "debian", "suite": "bookworm"}
    assert any("Ubuntu 24.04" in n for n in notes)  # named, not silently taken for Debian


def test_an_environment_that_does_not_fit_gives_its_problems_and_no_lock(
    repo: Path, tmp_path: Path
) -> None:
    """The unit asks for 8 GPUs of a machine NVML sees one of: the spec is written (its
    problems name its lines) and not locked."""
    wheels = [make_wheel(tmp_path / "w", "vllm", "0.33.0", {"vllm/__init__.py": ""})]
    venv = make_venv(tmp_path / "v", "vllm", find_links=tmp_path / "w")
    nvml = RecordedNvml(FIXTURES / "h200-nvml-idle.json")
    with served(wheels, tmp_path / "ix") as url:
        opts = Options(str(venv), repo, name="big", unit=str(_unit(tmp_path)), index_url=url)
        opts.nvml, opts.store = nvml, Store(tmp_path / "st")
        with pytest.raises(SpecError) as caught:
            adopt(opts)
    keys = {p.key for p in caught.value.problems}
    assert "serve.tensor_parallel_size" in keys and "vllm.extras" in keys
    assert all(p.file == str(repo / "specs" / "big.toml") for p in caught.value.problems)
    assert (repo / "specs" / "big.toml").is_file()
    assert not (repo / "lockfiles").exists()
