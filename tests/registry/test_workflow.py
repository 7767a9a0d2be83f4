"""The GitHub Actions workflow that builds images in CI: it loads, and it runs `envbuild ci` the
way the docs say (quickstart on every push, the seed specs on demand and on a schedule)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
