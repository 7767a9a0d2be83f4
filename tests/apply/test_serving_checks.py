"""What apply asks the generation's own vLLM before it switches (issue #25):

* the unit's model reference, resolved by the locked vLLM's and vllm-gguf-plugin's own code
  after the fetch: glm5-gguf's unit names what the plugin loads, from what apply fetched; a
  reference the plugin does not take (the old ``<snapshot>/UD-IQ2_XXS:UD-IQ2_XXS``), a shard
  missing or a file that was not fetched is refused (exit 2) with the reason;
* the verdicts kept in the store: a hit checks in milliseconds, a changed argument or wheel
  checks again, a damaged record is ignored and checked again, never trusted.

The plugin venv is the glm5-gguf lock's vllm-gguf-plugin 0.0.5, gguf 0.19.0 and triton over the
vLLM 0.33.0 parser venv (``tools/vllm_serve_flags.py gguf-venv``; scripts/test builds it and
sets ENVBUILD_VLLM_GGUF). The cache's own tests count probe runs with a stand-in for vLLM's
parser modules (tests/cases/apply/counting_vllm) in a venv of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from envbuild.apply import unit as units
from envbuild.apply.core import model_problem, refuse_unloadable, vllm_parses
from envbuild.apply.generations import Generation, GenerationMeta
from envbuild.apply.modelcache import ModelResult, repo_folder
from envbuild.apply.paths import Paths
from envbuild.apply.servecheck import ParseResult, check_command, resolve_models
from envbuild.apply.venv import INSTALL_LOCK
from envbuild.errors import ExitCode, UserError
from envbuild.spec import load_spec
from envbuild.spec.model import Spec
from envbuild.store.core import Store, derivation_key

REPO = Path(__file__).resolve().parent.parent.parent
CASES = REPO / "tests" / "cases" / "apply"
DEFAULT = Path.home() / ".cache" / "envbuild-tests" / "vllm-gguf-plugin-0.0.5" / "bin" / "python"
GGUF = Path(os.environ.get("ENVBUILD_VLLM_GGUF") or DEFAULT)
REV_MODEL, REV_CONFIG = "a" * 40, "b" * 40
GLM5_LOCK = REPO / "lockfiles" / "pylock.glm5-gguf.toml"


@pytest.fixture
def gguf_python() -> Path:
    if not GGUF.exists():
        why = f"no vllm-gguf-plugin venv at {GGUF} (scripts/test makes it)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return GGUF


def generation(tmp: Path, venv: Path, lock: Path) -> Generation:
    """A generation folder whose venv is ``venv`` (a link to it) and whose install lock is
    ``lock``: what the checks read of a generation."""
    path = tmp / "state" / "generations" / "1-x"
    path.mkdir(parents=True)
    (path / "venv").symlink_to(venv)
    shutil.copyfile(lock, path / INSTALL_LOCK)
    meta = GenerationMeta.model_construct(
        number=1, content_hash="x", spec_name="t", spec_hash="x", lock_sha256="x",
        created=datetime.now(UTC), python="3.11", origin="t", spec_path="t", lock_path="t",
        unit=None, packages={}, files={}, interpreter=None,
    )  # fmt: skip
    return Generation(1, path, meta)


def glm5(revisions: bool = True, **gguf: str) -> Spec:
    spec = load_spec(REPO / "specs" / "glm5-gguf.toml").spec
    assert spec.model is not None and spec.model.gguf is not None
    model = spec.model.model_copy(
        update={
            "revision": REV_MODEL,
            "gguf": spec.model.gguf.model_copy(update=gguf),
            "config": spec.model.config.model_copy(update={"revision": REV_CONFIG}),  # type: ignore[union-attr]
            "tokenizer": spec.model.tokenizer.model_copy(update={"revision": REV_CONFIG}),  # type: ignore[union-attr]
        }
    )
    return spec.model_copy(update={"model": model})


def fetched_glm5(paths: Paths, shards: int = 6, present: int | None = None) -> list[ModelResult]:
    """The HF cache as apply leaves it after fetching glm5-gguf (tiny GGUF shards: the magic)."""
    hub = paths.hf_hub_cache
    model = repo_folder(hub, "unsloth/GLM-5-GGUF") / "snapshots" / REV_MODEL
    (model / "UD-IQ2_XXS").mkdir(parents=True)
    for i in range(1, (present or shards) + 1):
        name = f"GLM-5-UD-IQ2_XXS-{i:05d}-of-{shards:05d}.gguf"
        (model / "UD-IQ2_XXS" / name).write_bytes(b"GGUF\x03\x00\x00\x00")
    config = repo_folder(hub, "zai-org/GLM-5") / "snapshots" / REV_CONFIG
    config.mkdir(parents=True)
    (config / "config.json").write_text('{"model_type": "glm_moe_dsa"}\n')
    return [
        ModelResult("unsloth/GLM-5-GGUF", REV_MODEL, model, shards, 0, True, True),
        ModelResult("zai-org/GLM-5", REV_CONFIG, config, 1, 0, True, True),
    ]


@pytest.mark.slow
def test_the_glm5_unit_names_what_the_locked_plugin_loads_from_the_fetch(
    gguf_python: Path, tmp_path: Path
) -> None:
    paths = Paths(tmp_path / "root")
    gen = generation(
        tmp_path, gguf_python.parent.parent, REPO / "lockfiles" / "pylock.glm5-gguf.toml"
    )
    spec = glm5()
    fetched = fetched_glm5(paths)
    store = Store(tmp_path / "store")
    # the exact command, parsed by the locked vLLM, its model resolved by the locked plugin
    parsed = vllm_parses(gen, spec, paths, store)
    assert parsed.ok is True, parsed.error
    argv = units.exec_start(spec, gen.venv, paths.hf_hub_cache)
    assert parsed.reference is not None and parsed.reference["model"] == argv[2]
    found = refuse_unloadable(gen, spec, paths, parsed, fetched, store)
    assert found is not None and found.kind == "gguf"
    first = fetched[0].path / "UD-IQ2_XXS" / "GLM-5-UD-IQ2_XXS-00001-of-00006.gguf"
    assert found.weights == str(first) and len(found.shards) == 6
    assert found.config == str(fetched[1].path)
    # the same generation, command and fetch again: both verdicts known, no vLLM imported
    start = time.perf_counter()
    again = vllm_parses(gen, spec, paths, store)
    known = refuse_unloadable(gen, spec, paths, again, fetched, store)
    assert again.cached and known is not None and known.cached
    assert time.perf_counter() - start < 1.0
    # a shard gone since: the fetch is not what the verdict was for, so it is checked again
    (fetched[0].path / "UD-IQ2_XXS" / "GLM-5-UD-IQ2_XXS-00006-of-00006.gguf").unlink()
    with pytest.raises(UserError) as err:
        refuse_unloadable(gen, spec, paths, again, fetched, store)
    assert err.value.exit_code == ExitCode.USER_ERROR
    assert "the plugin finds 5 of its 6 shards" in err.value.message


@pytest.mark.slow
def test_a_model_the_locked_plugin_would_not_load_is_refused_with_the_reason(
    gguf_python: Path, tmp_path: Path
) -> None:
    paths = Paths(tmp_path / "root")
    gen = generation(tmp_path, gguf_python.parent.parent, GLM5_LOCK)
    spec = glm5()
    fetched = fetched_glm5(paths, shards=6, present=5)
    snapshot = fetched[0].path
    config = str(fetched[1].path)
    elsewhere = tmp_path / "elsewhere" / "GLM-5-UD-IQ2_XXS.gguf"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b"GGUF")
    wrong = units.exec_start(
        glm5(file="GLM-5-UD-IQ2_XXS-00001-of-00005.gguf"), gen.venv, paths.hf_hub_cache
    )[2]
    models = {
        # the unit's old reference: the plugin's <dir>:<quant> form takes no UD- quant, so vLLM
        # reads it as a repo id or folder
        f"{snapshot}/UD-IQ2_XXS:UD-IQ2_XXS": "as a Hugging Face repo id or a folder and finds "
        "no model there",
        # the plugin would load 5 of the 6 shards the first file's name promises
        f"{snapshot}/UD-IQ2_XXS/GLM-5-UD-IQ2_XXS-00001-of-00006.gguf": "the plugin finds 5 of "
        "its 6 shards",
        # a .gguf elsewhere than in what apply fetched
        str(elsewhere): f"not into the fetched snapshot {snapshot}",
        # the spec's file name wrong: nothing at the unit's path
        wrong: "vllm-gguf-plugin cannot find the weights",
    }
    refs = [
        {"model": m, "tokenizer": config, "hf_config_path": config, "revision": None}
        for m in models
    ]
    results = resolve_models(gguf_python, refs, paths.hf_home)  # one process for all four
    for (model, why), result in zip(models.items(), results, strict=True):
        problem = model_problem(result, fetched, spec)
        assert problem is not None and why in problem, (model, problem)
    # and apply refuses the old reference: exit 2, the reason, nothing switched
    with pytest.raises(UserError) as err:
        refuse_unloadable(gen, spec, paths, ParseResult(True, None, refs[0]), fetched)
    assert err.value.exit_code == ExitCode.USER_ERROR
    assert models[str(refs[0]["model"])] in err.value.message
    assert "nothing was switched" in (err.value.hint or "")


# -- the verdict cache, counted --------------------------------------------------------------


@pytest.fixture(scope="module")
def counting_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("counting") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    [site] = (venv / "lib").glob("python3*/site-packages")
    shutil.copytree(CASES / "counting_vllm" / "vllm", site / "vllm")
    return venv


def lock_with(tmp: Path, vllm_sha: str) -> Path:
    lock = tmp / f"pylock-{vllm_sha[:4]}.toml"
    lock.write_text(
        'lock-version = "1.0"\n\n[[packages]]\nname = "vllm"\nversion = "0.0.1"\n'
        'wheels = [{ name = "vllm-0.0.1-py3-none-any.whl", '
        f'hashes = {{ sha256 = "{vllm_sha}" }} }}]\n'
    )
    return lock


def test_a_verdict_is_kept_by_wheels_and_argv_and_a_damaged_one_never_trusted(
    counting_venv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tmp_path / "runs.log"
    monkeypatch.setenv("COUNTING_VLLM_LOG", str(runs))
    store = Store(tmp_path / "store")
    gen = generation(tmp_path / "a", counting_venv, lock_with(tmp_path, "1" * 64))
    argv = ["org/model", "--port", "8000"]

    def count() -> int:
        return len(runs.read_text().splitlines()) if runs.exists() else 0

    first = check_command(gen, argv, store)
    assert first.ok is True and not first.cached and count() == 1
    assert first.reference == {"model": "org/model", "tokenizer": None, "hf_config_path": None,
                               "revision": None}  # fmt: skip
    # a hit: the same wheels and argv (another generation sharing them), in milliseconds
    other = generation(tmp_path / "b", counting_venv, lock_with(tmp_path, "1" * 64))
    start = time.perf_counter()
    hit = check_command(other, argv, store)
    assert hit.cached and hit.ok is True and hit.reference == first.reference
    assert time.perf_counter() - start < 0.5 and count() == 1
    # a changed argv is checked again
    assert not check_command(gen, [*argv, "--revision", "c" * 40], store).cached
    assert count() == 2
    # a changed wheel (vLLM's sha256) is checked again
    changed = generation(tmp_path / "c", counting_venv, lock_with(tmp_path, "2" * 64))
    assert not check_command(changed, argv, store).cached and count() == 3
    # a damaged record is ignored and checked again (and written anew), never trusted
    [record] = [p for p in store.drvs.glob("*.json") if json.loads(p.read_text())["inputs"]
                .get("argv") == argv and json.loads(p.read_text())["inputs"]["environment"]
                ["wheels"][0][2] == ["1" * 64]]  # fmt: skip
    record.write_text(record.read_text()[:40])
    assert not check_command(gen, argv, store).cached and count() == 4
    assert check_command(gen, argv, store).cached and count() == 4
    data = json.loads(record.read_text())
    data["meta"]["answer"]["ok"] = "yes"  # not an answer the probe gives
    record.write_text(json.dumps(data))
    assert not check_command(gen, argv, store).cached and count() == 5
    data = json.loads(record.read_text())
    data["inputs"]["argv"] = ["another/model"]  # a record whose inputs are not its key's
    record.write_text(json.dumps(data))
    assert derivation_key("vllm-verdict", data["inputs"]) != record.stem
    result = check_command(gen, argv, store)
    assert not result.cached and result.ok is True and count() == 6
