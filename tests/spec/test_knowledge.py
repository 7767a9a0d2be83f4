"""The knowledge base loads, every fact has a source, and it encodes the facts the issue states
(verified 2026-11). A change to knowledge.toml that contradicts them fails here."""

from __future__ import annotations

import tomllib
from importlib import resources

import pytest

from envbuild.spec import facts, load_spec
from envbuild.spec import knowledge as kb
from spec.cases import CASES


def _facts(data: dict[str, object]) -> list[tuple[str, object]]:
    """The facts of knowledge.toml: the items of its arrays of tables, and its plain tables."""
    out: list[tuple[str, object]] = []
    for key, value in data.items():
        if isinstance(value, list):
            out.extend((f"{key}[{i}]", item) for i, item in enumerate(value))
        elif isinstance(value, dict):
            out.append((key, value))
    return out


def test_every_fact_names_its_source():
    text = resources.files("envbuild.spec").joinpath("knowledge.toml").read_text("utf-8")
    facts = _facts(tomllib.loads(text))
    assert len(facts) > 40
    for path, fact in facts:
        assert isinstance(fact, dict), path
        assert str(fact.get("source", "")).strip(), f"{path} has no source"


@pytest.mark.parametrize(
    ("cuda", "driver"),
    [
        ("12.8", "570.26"),
        ("13.0", "580.65.06"),
        ("13.1", "590.44.01"),
        ("13.1.1", "590.48.01"),
        ("13.2", "595.45.04"),
    ],
)
def test_cuda_minimum_drivers(cuda, driver):
    fact = kb.min_driver(cuda)
    assert fact is not None and fact.driver == driver


@pytest.mark.parametrize(
    ("driver", "newest"),
    [("590.48.01", "13.1"), ("595.45.04", "13.2"), ("580.65.06", "13.0"), ("575.51.03", None)],
)
def test_the_newest_cuda_a_driver_runs(driver, newest):
    assert kb.newest_cuda_for(driver, 13) == newest


def test_run_time_compilers_newer_than_the_drivers_cuda():
    locked = [
        ("nvidia-nvjitlink", "13.5.37"),
        ("nvidia-cuda-nvrtc-cu13", "13.1.80"),
        ("nvidia-nvvm", "13.2.0"),
        ("nvidia-cuda-nvcc-cu12", "12.9.86"),
        ("nvidia-cublas", "13.5.1"),
        ("nvidia-nvjitlink", "not-a-version"),
    ]
    assert kb.newer_run_time_compilers("13.1", locked) == [
        "nvidia-nvjitlink 13.5.37", "nvidia-nvvm 13.2.0"
    ]  # fmt: skip
    assert kb.newer_run_time_compilers("13.5", locked) == []


def test_cuda_13_needs_580_and_dropped_archs_below_7_5():
    floor = kb.major_min_driver(13)
    assert floor is not None and kb.driver_key(floor.driver) == (580,)
    for release in ("13.0", "13.1", "13.2"):
        fact = kb.toolkit_archs(release)
        assert fact is not None
        assert min(fact.archs, key=lambda c: tuple(map(int, c.split(".")))) == "7.5"
        assert "12.0" in fact.archs
    older = kb.toolkit_archs("12.8")
    assert older is not None and "5.0" in older.archs and "12.0" in older.archs


@pytest.mark.parametrize(
    ("name", "cc"),
    [
        ("RTX PRO 6000 Blackwell Server Edition", "12.0"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "12.0"),  # NVML's spelling
        ("rtx pro 6000", "12.0"),
        ("H100", "9.0"),
        ("H200", "9.0"),
        ("B200", "10.0"),
        ("GB10", "12.1"),
        ("A100-SXM4-80GB", "8.0"),
        ("L40S", "8.9"),
    ],
)
def test_gpu_compute_capabilities(name, cc):
    fact = kb.gpu(name)
    assert fact is not None and fact.compute_capability == cc


def test_gpu_memory_and_suggestions():
    assert kb.gpu("RTX PRO 6000 Blackwell")
    assert {kb.gpu(n).memory_gib for n in ("RTX PRO 6000", "H100", "H200", "B200")} == {  # type: ignore[union-attr]
        96,
        80,
        141,
        180,
    }
    assert kb.gpu("H1000") is None
    assert "H100" in kb.suggest_gpu("H1000")


def test_torch_and_vllm_facts():
    assert kb.vllm_torch("0.33.0") == "2.14.0"
    assert kb.vllm_torch("0.99.0") is None
    for version in ("2.11.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1"):
        fact = kb.torch_pypi_cuda(version)
        assert fact is not None and fact.cuda == "cu130"
    fact = kb.torch_pypi_cuda("2.15.0")
    assert fact is not None and fact.cuda == "cu132"
    assert not any(f.cuda == "cu131" for f in facts.knowledge().torch_pypi)


def test_model_families_gguf_and_kv_rules():
    kimi = kb.model_family("nvidia/Kimi-K2.5-NVFP4")
    assert kimi is not None and kimi.min_vllm == "0.15.0" and kimi.attention == "mla"
    assert kb.model_family("zai-org/GLM-5.1") is None  # a different release
    plugin = kb.gguf("0.24.0")
    assert plugin is not None and plugin.packages == ["vllm-gguf-plugin"]
    assert plugin.extra == "extra-quant"
    builtin = kb.gguf("0.23.0")
    assert builtin is not None and builtin.packages == []

    def mla_dtypes(vllm: str) -> list[str]:
        (rule,) = [r for r in kb.kv_cache_rules("12.0", vllm) if r.attention == "mla"]
        return rule.dtypes

    assert "fp8" not in mla_dtypes("0.17.0")
    assert "fp8" in mla_dtypes("0.33.0")


def test_debian_suites_and_target_platform(tmp_path):
    assert (kb.glibc_of_suite("bookworm"), kb.debian("bookworm").python) == ("2.36", "3.11")  # type: ignore[union-attr]
    assert (kb.glibc_of_suite("trixie"), kb.debian("trixie").python) == ("2.41", "3.13")  # type: ignore[union-attr]
    assert kb.glibc_of_suite("sid") is None
    assert kb.platform_glibc("manylinux_2_36_x86_64") == (2, 36)
    assert kb.platform_glibc("musllinux_1_2_x86_64") is None

    (tmp_path / ".git").mkdir()
    (tmp_path / "specs" / "base").mkdir(parents=True)
    (tmp_path / "specs" / "base" / "host.toml").write_text(
        (CASES / "_shared" / "host.toml").read_text()
    )
    spec = tmp_path / "specs" / "s.toml"
    spec.write_text('extends = "base/host.toml"\n')
    assert kb.target_platform(load_spec(spec).spec) == "manylinux_2_36_x86_64"
    spec.write_text('extends = "base/host.toml"\n[python]\nplatform = "manylinux_2_35_x86_64"\n')
    assert kb.target_platform(load_spec(spec).spec) == "manylinux_2_35_x86_64"


def test_flash_attn_flags():
    fact = kb.source_build("flash_attn", "2.8.3.post2")
    assert fact is not None
    assert fact.arch_env == "FLASH_ATTN_CUDA_ARCHS" and fact.arch_default == "80;90;100;120"
    assert (fact.force_build_env, fact.force_build_value) == ("FLASH_ATTENTION_FORCE_BUILD", "TRUE")
    assert {"MAX_JOBS", "NVCC_THREADS"} <= set(fact.int_env)
    assert kb.source_build("flash-attn", "2.5.0") is None
