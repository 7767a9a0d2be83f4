"""The build and dockerfile commands, in-process."""

from __future__ import annotations

from collections.abc import Callable

from conftest import REPO, CliResult


def test_dry_run_prints_the_plan_of_the_quickstart(cli: Callable[..., CliResult]) -> None:
    result = cli("build", "--dry-run", "--json", REPO / "specs/quickstart.toml")
    assert result.exit_code == 0, result.stderr
    data = result.json()
    assert data["format"] == 1
    assert data["spec"] == "quickstart"
    names = {d["name"] for layer in data["layers"] for d in layer["dists"]}
    assert {"rich", "requests", "pygments"} <= names
    assert data["layers"][0]["name"] == "venv"
    text = cli("build", "--dry-run", REPO / "specs/quickstart.toml")
    assert text.exit_code == 0
    assert "rich==13.9.4" in text.stdout


def test_dry_run_shows_the_source_builds_flags_and_the_patches(
    cli: Callable[..., CliResult],
) -> None:
    text = cli("build", "--dry-run", REPO / "specs/glm5-gguf.toml")
    assert text.exit_code == 0, text.stderr
    (build,) = [ln for ln in text.stdout.splitlines() if ln.strip().startswith("source-build")]
    for flag in (
        "FLASH_ATTENTION_FORCE_BUILD=TRUE",
        "FLASH_ATTN_CUDA_ARCHS=120",
        "TORCH_CUDA_ARCH_LIST=12.0",
        "MAX_JOBS=16",
        "NVCC_THREADS=4",
    ):
        assert flag in build
    (patch,) = [ln for ln in text.stdout.splitlines() if ln.strip().startswith("patch  vllm:")]
    assert "specs/patches/vllm-glm-moe-dsa-fp8-kv-sm120.patch" in patch
    assert "-> vllm 0.33.0+envbuild." in patch
    data = cli("build", "--dry-run", "--json", REPO / "specs/glm5-gguf.toml").json()
    assert [(s["kind"], s["dist"]) for s in data["sources"]] == [
        ("source-build", "flash-attn"),
        ("patch", "vllm"),
    ]
    provisional = [x["name"] for x in data["layers"] if x["provisional"]]
    assert provisional == ["vllm", "flash-attn"]
