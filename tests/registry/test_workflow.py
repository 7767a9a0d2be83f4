"""The GitHub Actions workflow that builds images in CI: it loads, and it runs `envbuild ci` the
way the docs say (quickstart on every push, the seed specs on demand and on a schedule)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "images.yml"


def load() -> dict[Any, Any]:
    data = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(data, dict)
    return data


def steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    return list(job["steps"])


def test_workflow_triggers() -> None:
    data = load()
    on = data.get("on", data.get(True))  # YAML 1.1 reads a bare `on` as true
    assert set(on) == {"push", "pull_request", "workflow_dispatch", "schedule"}
    assert on["schedule"][0]["cron"]
    assert "specs" in on["workflow_dispatch"]["inputs"]


def test_seed_specs_named_in_the_workflow_exist() -> None:
    seed = load()["env"]["SEED_SPECS"].split()
    assert seed, "the workflow names no seed specs"
    for name in [*seed, "quickstart"]:
        assert (REPO / "specs" / f"{name}.toml").is_file(), name


def test_build_job_runs_envbuild_ci_with_a_login_from_secrets() -> None:
    jobs = load()["jobs"]
    build = jobs["build"]
    assert build["needs"] == "plan"
    assert "matrix.spec" in str(build["name"])
    assert build["strategy"]["matrix"]["spec"] == "${{ fromJSON(needs.plan.outputs.specs) }}"
    uses = [s.get("uses", "") for s in steps(build)]
    assert any(u.startswith("actions/checkout@") for u in uses)
    assert any(u.startswith("actions/setup-python@") for u in uses)
    login = next(s for s in steps(build) if s.get("uses", "").startswith("docker/login-action@"))
    assert "secrets." in login["with"]["password"]
    runs = "\n".join(s.get("run", "") for s in steps(build))
    assert "apt-get install" in runs and "skopeo" in runs and "mmdebstrap" in runs
    assert "envbuild ci" in runs and "--push" in runs and "--summary" in runs
    assert "secrets." not in runs  # secrets reach no command line
    plan = "\n".join(s.get("run", "") for s in steps(jobs["plan"]))
    assert 'push|pull_request) names="quickstart"' in plan


def _pick(tmp_path: Path, event: str, requested: str = "", image_repo: str = "") -> dict[str, Any]:
    """Run the plan job's shell step as Actions would, and read what it outputs."""
    import json
    import os
    import subprocess

    data = load()
    step = steps(data["jobs"]["plan"])[0]
    out = tmp_path / f"output-{event}"
    env = {
        **os.environ,
        "GITHUB_OUTPUT": str(out),
        "SEED_SPECS": data["env"]["SEED_SPECS"],
        "EVENT": event,
        "REQUESTED": requested,
        "IMAGE_REPO": image_repo,
        "OWNER": "Acme-Labs",
    }
    subprocess.run(["bash", "-e", "-c", step["run"]], env=env, check=True)
    pairs: dict[str, Any] = dict(line.split("=", 1) for line in out.read_text().splitlines())
    pairs["specs"] = json.loads(pairs["specs"])
    return pairs


def test_plan_step_picks_specs_per_event(tmp_path: Path) -> None:
    seed = load()["env"]["SEED_SPECS"].split()
    assert _pick(tmp_path, "push")["specs"] == ["quickstart"]
    assert _pick(tmp_path, "pull_request")["specs"] == ["quickstart"]
    assert _pick(tmp_path, "schedule")["specs"] == seed
    assert _pick(tmp_path, "workflow_dispatch", "kimi-nvfp4 glm5-gguf")["specs"] == [
        "kimi-nvfp4",
        "glm5-gguf",
    ]
    assert _pick(tmp_path, "push")["repo"] == "ghcr.io/acme-labs/envbuild"
    assert _pick(tmp_path, "push", image_repo="reg.example/x")["repo"] == "reg.example/x"
    # the login goes to the registry the images are pushed to
    assert _pick(tmp_path, "push")["registry"] == "ghcr.io"
    assert _pick(tmp_path, "push", image_repo="reg.example:5000/t/x")["registry"] == (
        "reg.example:5000"
    )


def test_the_login_and_the_push_use_one_registry() -> None:
    build = load()["jobs"]["build"]
    login = next(s for s in steps(build) if s.get("uses", "").startswith("docker/login-action@"))
    assert login["with"]["registry"] == "${{ needs.plan.outputs.registry }}"
    assert build["env"]["IMAGE_REPO"] == "${{ needs.plan.outputs.repo }}"
    text = (REPO / ".github" / "workflows" / "images.yml").read_text()
    assert "vars.ENVBUILD_REGISTRY" not in text
    docs = (REPO / "docs" / "registry.md").read_text()
    for variable in (
        "ENVBUILD_IMAGE_REPO",
        "ENVBUILD_COMPRESSION",
        "ENVBUILD_BUILDER",
        "ENVBUILD_LARGE_RUNNER",
        "REGISTRY_USERNAME",
        "REGISTRY_PASSWORD",
    ):
        assert variable in docs, f"docs/registry.md does not document {variable}"  # fmt: skip


def test_the_compression_reaches_envbuild_ci() -> None:
    build = load()["jobs"]["build"]
    (step,) = [s for s in steps(build) if "envbuild ci" in s.get("run", "")]
    assert '--compression "$COMPRESSION"' in step["run"]
    assert "vars.ENVBUILD_COMPRESSION" in step["env"]["COMPRESSION"]
    choice = load()[True]["workflow_dispatch"]["inputs"]["compression"]
    assert set(choice["options"]) >= {"zstd", "gzip"}
    import subprocess
    import sys

    helped = subprocess.run([sys.executable, "-m", "envbuild", "ci", "--help"],
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "--compression {zstd,gzip}" in helped and "docker >= 23.0" in helped


def test_the_workflow_is_valid_for_github(tmp_path: Path) -> None:
    """check-jsonschema against the GitHub workflow schema it ships (no network)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
         str(REPO / ".github" / "workflows" / "images.yml")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text(
        (REPO / ".github/workflows/images.yml").read_text().replace("runs-on:", "runs_on:", 1)
    )
    bad = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
         str(broken)], capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert bad.returncode == 1  # the check can fail


# --- what the build job needs on GitHub's ubuntu-24.04 ---------------------------------------


def _build_steps() -> list[dict[str, Any]]:
    return steps(load()["jobs"]["build"])


def _index(pred: Any) -> int:
    return next(i for i, s in enumerate(_build_steps()) if pred(s))


def _ci_step() -> int:
    return _index(lambda s: "envbuild ci" in s.get("run", ""))


def test_build_runs_as_root_with_the_jobs_environment() -> None:
    """mmdebstrap as a plain user needs a user namespace, which Ubuntu 24.04's AppArmor denies
    (kernel.apparmor_restrict_unprivileged_userns): envbuild ci runs under sudo, so mmdebstrap
    takes its root mode, with the job's variables, PATH (sudo's secure_path would drop
    setup-python's bin) and HOME (the registry login's ~/.docker/config.json)."""
    run = _build_steps()[_ci_step()]["run"]
    line = next(
        x for x in run.splitlines() if "envbuild ci" in x and not x.lstrip().startswith("#")
    )
    assert line.split()[:2] == ["sudo", "--preserve-env"], line
    assert '"PATH=$PATH"' in line and '"HOME=$HOME"' in line
    assert line.index("env ") < line.index("envbuild ci")


def test_mmdebstrap_gets_the_debian_archive_keys() -> None:
    """An Ubuntu host's apt trusts no Debian key: mmdebstrap adds signed-by for a known Debian
    suite when debian-archive-keyring (and gpg, to check it) is installed."""
    install = _build_steps()[_index(lambda s: "apt-get install" in s.get("run", ""))]["run"]
    words = install.replace("\\\n", " ").split()
    assert {"mmdebstrap", "debian-archive-keyring", "gpg"} <= set(words)


def _shim_sudo(tmp_path: Path) -> str:
    """A `sudo` that runs its command as the caller (the tests run where sudo may be absent)."""
    import os

    bindir = tmp_path / "shim-bin"
    bindir.mkdir()
    sudo = bindir / "sudo"
    sudo.write_text('#!/bin/sh\nexec "$@"\n')
    sudo.chmod(0o755)
    return f"{bindir}{os.pathsep}{os.environ['PATH']}"


def _run_step(step: dict[str, Any], tmp_path: Path, **env: str) -> dict[str, str]:
    """Run a build-job shell step as Actions would; returns what it appended to GITHUB_ENV."""
    import os
    import subprocess

    github_env = tmp_path / "github-env"
    github_env.touch()
    full = {**os.environ, "GITHUB_ENV": str(github_env), **dict(step.get("env", {})), **env}
    subprocess.run(["bash", "-e", "-c", step["run"]], env=full, check=True, cwd=REPO)
    return dict(line.split("=", 1) for line in github_env.read_text().splitlines())


def test_store_step_sets_the_store_and_uv_cache_before_the_build(tmp_path: Path) -> None:
    i = _index(lambda s: "ENVBUILD_STORE=" in s.get("run", ""))
    assert i < _ci_step()
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    out = _run_step(
        _build_steps()[i], tmp_path, GITHUB_WORKSPACE=str(workspace), PATH=_shim_sudo(tmp_path)
    )
    store = Path(out["ENVBUILD_STORE"])
    assert out["UV_CACHE_DIR"] == f"{store}-uv-cache"
    assert store.is_dir() and Path(out["UV_CACHE_DIR"]).is_dir()
    assert store in (workspace / ".envbuild-store", Path("/mnt/envbuild-store"))
    if store == workspace / ".envbuild-store":  # the checkout's disk had more room, or no /mnt
        return
    Path(out["UV_CACHE_DIR"]).rmdir()
    store.rmdir()


def _toolkit(*args: str) -> list[str]:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "cuda_toolkit.py"), *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    return done.stdout.splitlines()


def test_cuda_compiler_step_feeds_envbuild_nvcc_to_the_build(tmp_path: Path) -> None:
    """The seed specs' flash-attn source build needs nvcc, which ubuntu-24.04 lacks: a step
    before the build installs NVIDIA's wheels and appends ENVBUILD_NVCC to GITHUB_ENV."""
    i = _index(lambda s: "scripts/cuda_toolkit.py" in s.get("run", ""))
    step = _build_steps()[i]
    installs = _index(lambda s: "pip install" in s.get("run", ""))
    assert installs < i < _ci_step()  # envbuild is installed first; the build sees the variable
    assert '>> "$GITHUB_ENV"' in step["run"]
    assert step["env"]["SPEC"] == "specs/${{ matrix.spec }}.toml"
    # for a spec without CUDA source builds the real step installs nothing and sets nothing
    quick = {**step, "env": {"SPEC": "specs/quickstart.toml"}}
    assert _run_step(quick, tmp_path, RUNNER_TEMP=str(tmp_path)) == {}
    assert not (tmp_path / "cuda-toolkit").exists()


def test_cuda_toolkit_matches_each_seed_spec() -> None:
    """Specs with CUDA source builds get nvcc at their [cuda] version and the headers torch's
    headers include at the lock's versions; the others get nothing."""
    import tomllib

    from envbuild.spec import load_spec

    seed = load()["env"]["SEED_SPECS"].split()
    built = []
    for name in seed:
        spec = REPO / "specs" / f"{name}.toml"
        loaded = load_spec(spec)
        reqs = _toolkit(str(spec), "unused", "--dry-run")
        if not loaded.spec.builds:
            assert reqs == [], name
            continue
        built.append(name)
        assert loaded.spec.cuda is not None
        release = ".".join(loaded.spec.cuda.version.split(".")[:2])
        for tool in ("nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm", "nvidia-cuda-cccl"):
            assert f"{tool}=={release}.*" in reqs, (name, reqs)
        lock = tomllib.loads((REPO / "lockfiles" / f"pylock.{name}.toml").read_text())
        versions = {p["name"]: p["version"] for p in lock["packages"]}
        for lib in ("nvidia-cublas", "nvidia-cusparse", "nvidia-cusolver"):
            assert f"{lib}=={versions[lib]}" in reqs, (name, lib)
    assert "glm5-gguf" in built  # flash-attn from source


@pytest.mark.network
@pytest.mark.slow
def test_cuda_toolkit_wheels_compile_and_link_cudart(tmp_path: Path) -> None:
    """The compiler part of the toolkit, really installed from PyPI: nvcc finds CCCL (CUB,
    libcu++) and links ``-lcudart`` through the links the script adds (wheels carry none)."""
    import importlib.util
    import subprocess

    from envbuild.lock.core import lock_path
    from envbuild.lock.io import read_lock
    from envbuild.spec import load_spec

    mod_spec = importlib.util.spec_from_file_location(
        "cuda_toolkit", REPO / "scripts" / "cuda_toolkit.py"
    )
    assert mod_spec is not None and mod_spec.loader is not None
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    loaded = load_spec(REPO / "specs" / "glm5-gguf.toml")
    lock = read_lock(lock_path(loaded))
    reqs = [r for r in mod.requirements(loaded, lock) if r.split("==")[0] in mod.TOOLKIT]
    nvcc = mod.install(tmp_path / "tk", reqs, lock.envbuild.exclude_newer.isoformat())
    home = nvcc.parent.parent
    assert (home / "lib64").resolve() == (home / "lib").resolve()
    src = tmp_path / "k.cu"
    src.write_text(
        "#include <cub/cub.cuh>\n#include <cuda/std/cstdint>\n#include <cuda_runtime.h>\n"
        "__global__ void k(cuda::std::uint32_t *x) { x[threadIdx.x] = threadIdx.x; }\n"
        "int launch(cuda::std::uint32_t *x) { k<<<1, 4>>>(x); return cudaGetLastError(); }\n"
    )
    so = tmp_path / "k.so"
    done = subprocess.run(
        [str(nvcc), "-arch=sm_120", "-Xcompiler", "-fPIC", "-shared", "-o", str(so), str(src),
         f"-L{home / 'lib64'}", "-lcudart"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    needed = subprocess.run(
        ["readelf", "-d", str(so)], capture_output=True, text=True, check=True
    ).stdout
    assert "libcudart.so.13" in needed


def test_every_lock_is_checked_on_every_event_and_the_check_passes() -> None:
    """The locks job has no `if` (it runs for pushes and pull requests too), covers every spec,
    and its command succeeds on this checkout (the committed locks are current)."""
    import shlex
    import subprocess
    import sys

    job = load()["jobs"]["locks"]
    assert "if" not in job
    (command,) = [s["run"] for s in steps(job) if "lock --check" in s.get("run", "")]
    assert command == "envbuild lock --check specs/*.toml"
    specs = sorted(str(p.relative_to(REPO)) for p in (REPO / "specs").glob("*.toml"))
    argv = [sys.executable, "-m", "envbuild", *shlex.split(command)[1:-1], *specs]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(": current") == len(specs)


def test_only_pull_request_runs_are_cancelled_by_newer_ones() -> None:
    concurrency = load()["concurrency"]
    assert "github.event_name" in concurrency["group"]  # a push never shares a weekly run's group
    assert concurrency["cancel-in-progress"] == "${{ github.event_name == 'pull_request' }}"
