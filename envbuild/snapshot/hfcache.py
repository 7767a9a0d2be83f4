"""The Hugging Face cache, read through huggingface_hub's own ``scan_cache_dir``: repos, revisions,
refs and sizes; and, in a full check, whether each blob's bytes match its name (sha256 for LFS
files, the git blob sha1 for small ones)."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from envbuild.errors import InputFileError
from envbuild.installed.hashing import hash_files
from envbuild.snapshot.model.services import BadBlob, HfCacheSection, ModelRepo, ModelRevision

log = logging.getLogger(__name__)


def default_cache() -> str:
    """Where huggingface_hub looks ($HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub)."""
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except ImportError:
        home = os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface"))
        return os.environ.get("HF_HUB_CACHE", os.path.join(home, "hub"))


_NOT_A_FOLDER_HINT = (
    "pass the Hugging Face hub cache folder (like ~/.cache/huggingface/hub) with --hf-cache, "
    "or --no-models to skip it"
)


def check_path(path: str) -> None:
    """A cache path that exists must be a folder (one that does not is "no cache there")."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise InputFileError(
            path, "is not a folder, so not a Hugging Face cache", hint=_NOT_A_FOLDER_HINT
        )


def _git_blob_sha1(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _bad_blobs(repo_path: Path, files_of: dict[str, list[str]]) -> list[BadBlob]:
    blobs = repo_path / "blobs"
    if not blobs.is_dir():
        return []
    names = sorted(
        p.name for p in blobs.iterdir() if p.is_file() and not p.name.endswith(".incomplete")
    )
    sha256 = [n for n in names if len(n) == 64]
    hashed = hash_files((str(blobs / n), (blobs / n).stat().st_size) for n in sha256)
    bad = []
    for name in names:
        if len(name) == 64:
            fh = hashed[str(blobs / name)]
            actual = fh.digest.hex() if fh.digest is not None else f"unreadable: {fh.error}"
        elif len(name) == 40:
            try:
                actual = _git_blob_sha1(blobs / name)
            except OSError as exc:
                actual = f"unreadable: {exc.strerror}"
        else:
            continue
        if actual != name:
            bad.append(BadBlob(blob=name, files=sorted(files_of.get(name, [])), actual=actual))
    return bad


def read_cache(cache_dir: str | None = None, *, check_blobs: bool = True) -> HfCacheSection:
    path = cache_dir or default_cache()
    try:
        from huggingface_hub import scan_cache_dir
        from huggingface_hub.errors import CacheNotFound
    except ImportError as exc:
        return HfCacheSection(
            available=False, path=path, reason=f"huggingface_hub is not installed ({exc})"
        )
    check_path(path)
    try:
        info = scan_cache_dir(path)
    except ValueError as exc:  # "Scan cache expects a directory": it became a file meanwhile
        raise InputFileError(
            path, f"not a Hugging Face cache ({exc})", hint=_NOT_A_FOLDER_HINT
        ) from exc
    except CacheNotFound:
        return HfCacheSection(available=False, path=path, reason="no Hugging Face cache there")
    except OSError as exc:
        return HfCacheSection(available=False, path=path, reason=f"cannot read it: {exc}")
    repos = []
    for repo in sorted(info.repos, key=lambda r: (r.repo_type, r.repo_id)):
        files_of: dict[str, list[str]] = {}
        revisions = []
        for rev in sorted(repo.revisions, key=lambda r: r.commit_hash):
            for f in rev.files:
                files_of.setdefault(Path(f.blob_path).name, []).append(
                    f"{rev.commit_hash[:12]}/{f.file_name}"
                )
            revisions.append(
                ModelRevision(
                    commit=rev.commit_hash,
                    refs=sorted(rev.refs),
                    files=len(rev.files),
                    size_bytes=rev.size_on_disk,
                )
            )
        repos.append(
            ModelRepo(
                repo_id=repo.repo_id,
                repo_type=repo.repo_type,
                size_bytes=repo.size_on_disk,
                revisions=revisions,
                bad_blobs=_bad_blobs(Path(repo.repo_path), files_of) if check_blobs else [],
            )
        )
    return HfCacheSection(
        available=True,
        path=path,
        blobs_checked=check_blobs,
        repos=repos,
        warnings=sorted(str(w) for w in info.warnings),
    )
