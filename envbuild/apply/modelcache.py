"""The model at its pinned revision, in the Hugging Face cache, fetched with huggingface_hub.

``snapshot_download(repo, revision=<commit>, allow_patterns=<spec files>)`` fills the standard
cache layout (``hub/models--org--name/{blobs,snapshots/<commit>,trees/<commit>.json}``); it resumes
interrupted files and skips complete ones. Before going to the network we ask the cache alone
(``local_files_only``): when the snapshot is complete (checked against the cached tree listing),
nothing is fetched, and ``HF_HUB_OFFLINE=1`` works.

huggingface_hub checks sizes only, so after a download every file is verified against the name of
its blob: the sha256 for LFS files, the git blob id (sha1 of ``blob <size>\\0<bytes>``) for others.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from envbuild.errors import EnvironmentFailure, IntegrityError
from envbuild.spec.model import AuxRepo, Model

log = logging.getLogger(__name__)

# huggingface_hub reads this when it is first imported: no telemetry, and no registry fetched
# into ~/.cache/huggingface (apply touches only the cache it is given).
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_GIT_SHA1 = re.compile(r"^[0-9a-f]{40}$")
CHUNK = 1 << 20

#: A repo at a commit with allow patterns: the model's own, or a tokenizer or config repo.
Pinned = Model | AuxRepo


@dataclass(frozen=True)
class ModelResult:
    repo: str
    revision: str
    path: Path  # the snapshot folder
    files: int
    size_bytes: int
    fetched: bool  # False: everything was already in the cache
    verified: bool


def repo_folder(hub_cache: Path, repo: str) -> Path:
    return hub_cache / ("models--" + repo.replace("/", "--"))


def snapshot_folder(hub_cache: Path, model: Pinned) -> Path:
    return repo_folder(hub_cache, model.repo) / "snapshots" / model.revision


def cached_bytes(hub_cache: Path, model: Pinned) -> int:
    """Bytes of this revision already in the cache (what a fetch will not download again)."""
    folder = snapshot_folder(hub_cache, model)
    total = 0
    if folder.is_dir():
        for path in _files(folder):
            try:
                total += path.stat().st_size
            except OSError:
                continue
    return total


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if not p.is_dir())


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _snapshot(
    hub_cache: Path, model: Pinned, *, local_files_only: bool = False, endpoint: str | None = None
) -> str:
    """huggingface_hub's snapshot folder of ``model`` (its revision, only its files when it
    names some) in ``hub_cache``: from the cache alone, or downloaded from ``endpoint``."""
    from huggingface_hub import snapshot_download

    return snapshot_download(
        model.repo,
        revision=model.revision,
        cache_dir=hub_cache,
        allow_patterns=list(model.files) or None,
        local_files_only=local_files_only,
        endpoint=endpoint,
    )


def find_cached(hub_cache: Path, model: Pinned) -> Path | None:
    """The snapshot folder when the cache holds every requested file, without the network."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = _snapshot(hub_cache, model, local_files_only=True)
    except (LocalEntryNotFoundError, FileNotFoundError):  # incomplete, too (a subclass)
        return None
    trees = repo_folder(hub_cache, model.repo) / "trees" / f"{model.revision}.json"
    if not trees.is_file() and not _offline():
        # Without the tree listing the cache cannot tell a complete snapshot from a partial one.
        return None
    return Path(folder)


def fetch(hub_cache: Path, model: Pinned, *, verify: bool = True) -> ModelResult:
    """Make the model's revision complete in the cache; fetch only what is missing."""
    folder = find_cached(hub_cache, model)
    fetched = False
    if folder is None:
        if _offline():
            raise EnvironmentFailure(
                f"{model.repo}@{model.revision[:12]} is not (completely) in {hub_cache} and "
                "HF_HUB_OFFLINE is set",
                hint="unset HF_HUB_OFFLINE to download it, or copy the cache here",
            )
        folder = _download(hub_cache, model)
        fetched = True
    files = _files(folder)
    size = sum(p.stat().st_size for p in files)
    if fetched and verify:
        verify_snapshot(folder)
    return ModelResult(model.repo, model.revision, folder, len(files), size, fetched, fetched)


def _download(hub_cache: Path, model: Pinned) -> Path:
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    log.info("fetching %s at %s into %s", model.repo, model.revision[:12], hub_cache)
    try:
        folder = _snapshot(hub_cache, model, endpoint=os.environ.get("HF_ENDPOINT") or None)
    except HfHubHTTPError as exc:
        raise EnvironmentFailure(
            f"the hub refused {model.repo}@{model.revision[:12]}: {exc}",
            hint="check the repo and revision, and HF_TOKEN for gated or private models",
        ) from exc
    except (LocalEntryNotFoundError, OSError) as exc:
        raise EnvironmentFailure(
            f"cannot fetch {model.repo}@{model.revision[:12]}: {exc}",
            hint="check the network (or HF_ENDPOINT); a rerun resumes where this stopped",
        ) from exc
    return Path(folder)


def verify_snapshot(folder: Path, workers: int | None = None) -> int:
    """Check every file of a snapshot against its blob's name. Returns how many were checked."""
    files = _files(folder)

    def check(path: Path) -> str | None:
        blob = path.resolve()
        expected = blob.name
        if _SHA256.match(expected):
            actual = _sha256(blob)
        elif _GIT_SHA1.match(expected):
            actual = _git_blob_id(blob)
        else:
            return None
        if actual != expected:
            return f"{path.relative_to(folder)} (blob {expected[:12]}…, content {actual[:12]}…)"
        return None

    with ThreadPoolExecutor(max_workers=workers or min(8, os.cpu_count() or 1)) as pool:
        bad = [b for b in pool.map(check, files) if b]
    if bad:
        raise IntegrityError(
            f"{len(bad)} file(s) of {folder} do not match their digest: " + "; ".join(bad[:5]),
            hint="delete those blobs from the cache and apply again to fetch them anew",
        )
    log.info("verified %d model files", len(files))
    return len(files)


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _git_blob_id(path: Path) -> str:
    h = hashlib.sha1(usedforsecurity=False)
    h.update(f"blob {path.stat().st_size}\0".encode())
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()
