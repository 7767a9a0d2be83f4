"""The Hugging Face cache, laid down by the test in the layout huggingface_hub documents
(models--org--name/{blobs,snapshots/<rev>,refs/main}) and read through its own scan."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from envbuild.snapshot.hfcache import read_cache

REV1 = "1" * 40
REV2 = "2" * 40


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def lay_down(cache: Path, repo: str, rev: str, files: dict[str, bytes], *, ref: str | None = "main",
             lfs: tuple[str, ...] = ()) -> Path:  # fmt: skip
    """Blobs named by their git blob id (small files) or sha256 (LFS files); the snapshot folder
    holds relative symlinks into blobs; refs/<ref> holds the commit."""
    top = cache / f"models--{repo.replace('/', '--')}"
    (top / "blobs").mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        blob = hashlib.sha256(data).hexdigest() if name in lfs else git_blob_id(data)
        (top / "blobs" / blob).write_bytes(data)
        link = top / "snapshots" / rev / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(top / "blobs" / blob, link.parent))
    if ref:
        (top / "refs").mkdir(exist_ok=True)
        (top / "refs" / ref).write_text(rev)
    return top


WEIGHTS = os.urandom(4096)


def test_repos_revisions_refs_and_sizes(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    files = {"config.json": b'{"a": 1}', "model.safetensors": WEIGHTS}
    lay_down(cache, "Qwen/Qwen3-0.6B", REV1, files, lfs=("model.safetensors",))
    lay_down(cache, "Qwen/Qwen3-0.6B", REV2, {"config.json": b'{"a": 2}'}, ref=None)
    section = read_cache(str(cache))
    assert section.available and section.blobs_checked
    [repo] = section.repos
    assert (repo.repo_id, repo.repo_type) == ("Qwen/Qwen3-0.6B", "model")
    assert [(r.commit, r.refs, r.files) for r in repo.revisions] == [
        (REV1, ["main"], 2),
        (REV2, [], 1),
    ]
    assert repo.size_bytes == len(WEIGHTS) + 2 * len(b'{"a": 1}')
    assert repo.bad_blobs == []


def test_a_blob_that_does_not_match_its_name_is_named(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    top = lay_down(cache, "org/model", REV1, {"model.safetensors": WEIGHTS, "config.json": b"{}"},
                   lfs=("model.safetensors",))  # fmt: skip
    blob = top / "blobs" / hashlib.sha256(WEIGHTS).hexdigest()
    blob.write_bytes(WEIGHTS[:-1] + b"!")
    [repo] = read_cache(str(cache)).repos
    [bad] = repo.bad_blobs
    assert bad.blob == blob.name
    assert bad.files == [f"{REV1[:12]}/model.safetensors"]
    assert bad.actual == hashlib.sha256(WEIGHTS[:-1] + b"!").hexdigest()
    # quick mode does not read the weights
    quick = read_cache(str(cache), check_blobs=False)
    assert quick.repos[0].bad_blobs == [] and quick.blobs_checked is False


def test_no_cache_is_said_plainly(tmp_path: Path) -> None:
    section = read_cache(str(tmp_path / "none"))
    assert section.available is False
    assert section.reason == "no Hugging Face cache there"


def test_a_new_revision_shows_in_diff_and_verify(cli: Any, tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    lay_down(cache, "org/model", REV1, {"config.json": b"{}"})
    args = ("--hf-cache", cache, "--no-docker", "--no-systemd")
    assert cli("snapshot", *args, "-o", tmp_path / "a.json").exit_code == 0
    lay_down(cache, "org/model", REV2, {"config.json": b'{"b": 1}'})
    assert cli("snapshot", *args, "-o", tmp_path / "b.json").exit_code == 0
    diff = cli("diff", tmp_path / "a.json", tmp_path / "b.json")
    assert diff.exit_code == 1
    assert (
        f"  model org/model: {REV1[:12]} (main) → {REV1[:12]}, {REV2[:12]} (main), +8 B"
        in diff.stdout
    )
    verify = cli("verify", tmp_path / "a.json")
    assert verify.exit_code == 1
    assert "models (Hugging Face cache):" in verify.stdout
