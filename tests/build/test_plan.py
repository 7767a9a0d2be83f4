"""The layer plan: stable grouping, big distributions alone, the budget, keys, the image config."""

from __future__ import annotations

from pathlib import Path

import pytest

from envbuild.build.config import image_config
from envbuild.build.plan import PlanOptions, bucket, layer_plan, shared_inputs
from envbuild.errors import UserError
from envbuild.installed.venv import VenvTarget
from envbuild.lock.wheels import WheelRef, target_tags
from envbuild.spec import load_spec

TARGET = VenvTarget(platform="manylinux_2_36_x86_64")
MB = 1024 * 1024


def wheel(name: str, version: str = "1.0", size: int = 100_000) -> WheelRef:
    sha = (name + version).encode().hex().ljust(64, "0")[:64]
    return WheelRef(name, version, f"{name}-{version}-py3-none-any.whl", "", sha, size)


def plan(wheels: list[WheelRef], **kw: object) -> dict[str, object]:
    common = {"target": TARGET, "installer": "uv 0.13.9", "pack": {"compressor": "zstd -3"},
              "source_date_epoch": 0}  # fmt: skip
    common |= {k: kw.pop(k) for k in list(kw) if k in common}
    opts = {"shared": shared_inputs(**common), "options": PlanOptions(), "base_layers": 1, **kw}  # type: ignore[arg-type]
    layers = layer_plan(wheels, **opts)  # type: ignore[arg-type]
    return {layer.name: layer for layer in layers}


SMALL = [wheel(n) for n in ("rich", "pygments", "idna", "urllib3", "certifi", "mdurl", "six")]
BIG = [wheel("torch", "2.9.0", 900 * MB), wheel("nvidia-cublas", "13.0", 500 * MB)]


def test_big_distributions_get_layers_of_their_own_and_vllm_is_on_top() -> None:
    layers = layer_plan(
        [*SMALL, *BIG, wheel("vllm", "0.33.0", 400 * MB)],
        shared=shared_inputs(TARGET, "uv", {}, 0),
        options=PlanOptions(),
        base_layers=1,
        top=["vllm"],
    )
    names = [layer.name for layer in layers]
    assert names[0] == "venv"
    assert names[1:3] == ["nvidia-cublas", "torch"]
    assert names[-1] == "vllm"
    grouped = sorted(d.name for layer in layers if layer.kind == "group" for d in layer.dists)
    assert grouped == sorted(w.name for w in SMALL)
    assert len(layers) + 1 <= PlanOptions().max_layers


def test_bumping_a_small_package_changes_only_its_group() -> None:
    before = plan([*SMALL, *BIG])
    bumped = [wheel("idna", "3.11") if w.name == "idna" else w for w in SMALL]
    after = plan([*bumped, *BIG])
    changed = sorted(n for n in before if before[n].key != after[n].key)  # type: ignore[attr-defined]
    assert changed == [f"group-{bucket('idna', PlanOptions().groups):02d}"]
    # adding a package touches only the group it falls in
    added = plan([*SMALL, wheel("zipp"), *BIG])
    changed = sorted(n for n in added if n not in before or before[n].key != added[n].key)  # type: ignore[attr-defined]
    assert changed == [f"group-{bucket('zipp', PlanOptions().groups):02d}"]


def test_a_big_layer_key_is_the_same_in_any_image() -> None:
    one = plan([*SMALL, *BIG])
    other = plan([wheel("numpy", "2.0"), *BIG])
    assert one["torch"].key == other["torch"].key  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "change",
    [
        {"target": VenvTarget(venv="/opt/other", platform="manylinux_2_36_x86_64")},
        {"target": VenvTarget(interpreter="/usr/local/bin/python3")},
        {"installer": "uv 0.14.0"},
        {"pack": {"compressor": "zstd -19"}},
        {"source_date_epoch": 1},
    ],
)
def test_every_input_of_the_bytes_is_in_the_key(change: dict[str, object]) -> None:
    assert plan(BIG)["torch"].key != plan(BIG, **change)["torch"].key  # type: ignore[attr-defined]


def test_the_budget_demotes_the_smallest_big_distributions() -> None:
    bigs = [wheel(f"nvidia-lib{i:02d}", "1", (40 + i) * MB) for i in range(20)]
    layers = plan(bigs, options=PlanOptions(max_layers=20, groups=4))
    own = sorted(n for n, layer in layers.items() if layer.kind == "dist")  # type: ignore[attr-defined]
    assert len(layers) + 1 <= 20
    assert own[0] == "nvidia-lib06"  # the 6 smallest went into groups
    with pytest.raises(UserError, match="layer budget"):
        plan(bigs, options=PlanOptions(max_layers=8, groups=8))


def test_overlap_rules_are_part_of_the_losers_key_only() -> None:
    ws = [wheel("cuda-python", "12.6"), wheel("cuda-bindings", "13.5")]
    plain = plan(ws)
    rules = {"cuda-python": {"winner": "cuda-bindings", "sha256": "a" * 64}}
    ruled = plan(ws, overlap_rules=rules)
    loser = f"group-{bucket('cuda-python', 8):02d}"
    assert plain[loser].key != ruled[loser].key  # type: ignore[attr-defined]
    assert ruled[loser].loses_to == {"cuda-python": "cuda-bindings"}  # type: ignore[attr-defined]


def test_target_tags_accept_older_manylinux() -> None:
    tags = {str(t) for t in target_tags("3.11", "manylinux_2_36_x86_64")}
    assert "cp311-cp311-manylinux_2_17_x86_64" in tags
    assert "cp311-cp311-manylinux2014_x86_64" in tags
    assert "py3-none-any" in tags
    assert "cp311-cp311-manylinux_2_39_x86_64" not in tags
    assert "cp312-cp312-manylinux_2_17_x86_64" not in tags


def _spec(repo: Path, body: str) -> Path:
    path = repo / "specs" / "x.toml"
    path.write_text(
        '[base]\nkind = "debian"\n[python]\nversion = "3.11"\n'
        "[resolution]\nexclude_newer = 2025-01-01T00:00:00Z\n" + body
    )
    return path


def test_serve_becomes_vllm_serve_and_secrets_stay_out(repo: Path) -> None:
    path = _spec(
        repo,
        '[vllm]\nversion = "0.33.0"\n'
        '[model]\nrepo = "org/model"\nrevision = "' + "a" * 40 + '"\nsize_gb = 1\n'
        "[serve]\ntensor_parallel_size = 8\nmax_model_len = 4096\nkv_cache_dtype = 'fp8'\n"
        "extra_args = ['--trust-remote-code']\n"
        "[serve.env]\nHF_TOKEN = '${HF_TOKEN}'\nVLLM_USE_V1 = '1'\n",
    )
    config = image_config(load_spec(path).spec, spec_hash="s" * 64, lock_hash="l" * 64)
    cmd = config.cmd
    assert cmd[:3] == ["vllm", "serve", "org/model"]
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "8"
    assert cmd[cmd.index("--max-model-len") + 1] == "4096"
    assert cmd[cmd.index("--kv-cache-dtype") + 1] == "fp8"
    assert cmd[-1] == "--trust-remote-code"
    assert "HF_TOKEN" not in config.env
    assert config.env["VLLM_USE_V1"] == "1"
    assert config.env["PATH"].startswith("/opt/venv/bin:")
    assert config.env["VIRTUAL_ENV"] == "/opt/venv"
    assert config.labels["dev.envbuild.lock-hash"] == "l" * 64
    assert all("${" not in value for value in [*cmd, *config.env.values()])


def test_a_secret_that_would_land_in_the_image_is_refused(repo: Path) -> None:
    path = _spec(repo, "[image]\nenv = { TOKEN = '${HF_TOKEN}' }\n")
    with pytest.raises(UserError, match="secret"):
        image_config(load_spec(path).spec, spec_hash="s", lock_hash="l")
