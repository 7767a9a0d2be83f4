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
