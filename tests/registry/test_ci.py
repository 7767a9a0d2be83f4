"""`envbuild ci`: lock check, build, push, summary — with envbuild's real lock and build, a
loopback registry and the remote cache."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.registry import Registry

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "specs" / "quickstart.toml"

Cli = Callable[..., Any]


def project(repo: Path) -> Path:
    """A project holding a copy of the quickstart spec (its lock is made by the test)."""
    spec = repo / "specs" / "quickstart.toml"
    shutil.copy(QUICKSTART, spec)
    return spec


def table_rows(summary: str) -> list[list[str]]:
    rows = [line for line in summary.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[1:]]


@pytest.mark.registry
def test_a_stale_lock_is_reported_and_not_built(
    cli: Cli, repo: Path, registry: Registry, tmp_path: Path
) -> None:
    spec = project(repo)
    summary = tmp_path / "summary.md"
    mark = registry.log_mark()
    result = cli(
        "ci", spec, "--push", registry.ref("ci/stale"), "--insecure", "--store",
        tmp_path / "store", "--summary", summary,
    )  # fmt: skip
    assert result.exit_code == 1, result.stderr
    assert "lock is stale" in result.stdout
    assert "envbuild lock" in result.stdout  # the fix is named
    rows = table_rows(summary.read_text())
    assert rows == [["quickstart", "stale", "—", "—", "—", "—", "—"]]
    assert "## Problems" in summary.read_text()
    assert registry.uploads(mark) == []
    assert not (repo / "images").exists()


@pytest.mark.registry
def test_a_spec_with_errors_does_not_stop_the_others(
    cli: Cli, repo: Path, registry: Registry, tmp_path: Path
) -> None:
    good = project(repo)
    bad = repo / "specs" / "broken.toml"
    bad.write_text('[base]\nkind = "debian"\n[python]\nversion = "not a version"\n')
    result = cli("ci", bad, good, "--store", tmp_path / "store", "--json")
    data = result.json()
    assert [s["lock"] for s in data["specs"]] == ["not checked", "stale"]
    assert data["specs"][0]["exit_code"] == 2 and data["specs"][0]["error"]
    assert result.exit_code == 2


@pytest.mark.registry
@pytest.mark.network
@pytest.mark.slow
def test_ci_builds_pushes_and_a_second_machine_reuses_the_cache(
    cli: Cli, repo: Path, registry: Registry, tmp_path: Path
) -> None:
    from envbuild.lock.core import lock_spec
    from envbuild.spec import load_spec

    spec = project(repo)
    lock_spec(load_spec(spec))
    images, cache = registry.ref("ci/images"), registry.ref("ci/cache")

    first_summary = tmp_path / "first.md"
    first = cli(
        "ci", spec, "--push", images, "--cache", cache, "--insecure",
        "--store", tmp_path / "machine-a", "--summary", first_summary, "--json",
    )  # fmt: skip
    assert first.exit_code == 0, first.stderr
    (a,) = first.json()["specs"]
    layout = repo / "images" / "quickstart" / "oci"
    index = json.loads((layout / "index.json").read_text())
    assert a["image"] == index["manifests"][0]["digest"]
    assert a["lock"] == "current" and a["layers_new"] >= 1
    assert a["pushed"] == f"{images}:quickstart" and a["blobs_uploaded"] >= 2
    status, body = registry.get("/v2/ci/images/manifests/quickstart")
    assert status == 200 and "sha256:" + hashlib.sha256(body).hexdigest() == a["image"]
    row = table_rows(first_summary.read_text())[0]
    assert row[:3] == ["quickstart", "current", f"`{a['image']}`"]
    assert first.json()["cache"]["published"]

    # Machine B: an empty store, the same cache. Nothing is installed or packed again, the
    # image is the same bit for bit, and the push uploads nothing.
    shutil.rmtree(repo / "images")
    second_summary = tmp_path / "second.md"
    second = cli(
        "ci", spec, "--push", images, "--cache", cache, "--insecure",
        "--store", tmp_path / "machine-b", "--summary", second_summary, "--json",
    )  # fmt: skip
    assert second.exit_code == 0, second.stderr
    (b,) = second.json()["specs"]
    assert b["image"] == a["image"]
    assert b["layers_new"] == 0 and b["layers_reused"] == a["layers_new"] + a["layers_reused"]
    assert b["blobs_uploaded"] == 0 and b["blobs_skipped"] == a["blobs_uploaded"]
    assert second.json()["cache"]["hits"]
    row = table_rows(second_summary.read_text())[0]
    assert row[4:6] == [str(b["layers_reused"]), "0"]
