"""The model at its pinned revision, through huggingface_hub, against the tests' local hub:
the standard cache layout, resuming a cut download, verification, and working offline."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from apply.conftest import REV_A
from support.hfhub import Hub

from envbuild.apply import modelcache
from envbuild.errors import EnvironmentFailure, IntegrityError
from envbuild.spec.model import Model

MODEL = Model(repo="org/tiny-a", revision=REV_A, size_gb=0.001, files=["*.json", "*.safetensors"])


def files_fetched(hub: Hub, since: int) -> list[str]:
    return sorted(
        p.rsplit("/", 1)[-1] for m, p in hub.requests[since:] if m == "GET" and "/resolve/" in p
    )


def test_fetch_lays_out_the_cache_and_is_resumed_after_a_cut(tmp_path: Path, hub: Hub) -> None:
    cache = tmp_path / "hub"
    before = len(hub.requests)
    hub.cut_once.add("model.safetensors")
    result = modelcache.fetch(cache, MODEL)
    assert result.fetched and result.verified and result.files == 3
    # model.safetensors was asked for twice: cut off half way, then resumed
    assert files_fetched(hub, before) == [
        "config.json",
        "model.safetensors",
        "model.safetensors",
        "tokenizer.json",
    ]
    repo = cache / "models--org--tiny-a"
    assert result.path == repo / "snapshots" / REV_A
    assert (repo / "trees" / f"{REV_A}.json").is_file()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        link = result.path / name
        assert link.is_symlink() and link.resolve().parent == repo / "blobs"
    assert not (result.path / "README.md").exists()
    assert modelcache.verify_snapshot(result.path) == 3
    assert modelcache.cached_bytes(cache, MODEL) == result.size_bytes


def test_a_cached_model_needs_no_hub_even_offline(
    tmp_path: Path, hub: Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "hub"
    modelcache.fetch(cache, MODEL)
    before = len(hub.requests)
    again = modelcache.fetch(cache, MODEL)
    assert not again.fetched and hub.requests[before:] == []
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    offline = modelcache.fetch(cache, MODEL)
    assert offline.path == again.path and not offline.fetched


def test_offline_without_the_model_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(EnvironmentFailure, match="HF_HUB_OFFLINE is set"):
        modelcache.fetch(tmp_path / "hub", MODEL)


def test_a_partial_snapshot_is_completed(tmp_path: Path, hub: Hub) -> None:
    cache = tmp_path / "hub"
    first = modelcache.fetch(cache, MODEL)
    link = first.path / "tokenizer.json"
    blob = link.resolve()
    # the link is gone but the blob is there: it is found again without downloading
    link.unlink()
    before = len(hub.requests)
    again = modelcache.fetch(cache, MODEL)
    assert again.fetched and again.files == 3 and files_fetched(hub, before) == []
    # the blob is gone too: only that file is downloaded
    link.unlink()
    blob.unlink()
    before = len(hub.requests)
    modelcache.fetch(cache, MODEL)
    assert files_fetched(hub, before) == ["tokenizer.json"]


def test_a_corrupted_blob_fails_verification(tmp_path: Path, hub: Hub) -> None:
    result = modelcache.fetch(tmp_path / "hub", MODEL)
    blob = (result.path / "config.json").resolve()
    os.chmod(blob, 0o644)
    blob.write_bytes(b'{"model": "tampered"}')
    with pytest.raises(IntegrityError, match=r"config.json \(blob "):
        modelcache.verify_snapshot(result.path)


def test_an_unknown_repo_is_a_clear_failure(tmp_path: Path, hub: Hub) -> None:
    missing = Model(repo="org/nope", revision=REV_A, size_gb=0.001)
    with pytest.raises(EnvironmentFailure, match="org/nope"):
        modelcache.fetch(tmp_path / "hub", missing)
