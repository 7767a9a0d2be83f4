"""The declared dependencies of a source build's sdist, read without building it.

A source build (flash-attn) is locked as its sdist and built later by envbuild with the spec's
flags. uv would build it to learn its dependencies — which for flash-attn means compiling CUDA
kernels, or downloading a prebuilt wheel from GitHub — so the resolver is given the metadata
statically instead (uv's ``dependency-metadata``). That metadata comes from the sdist's own
``PKG-INFO``: the sdist is downloaded, checked against the size and sha256 the index gave, and
its ``Requires-Dist`` and ``Requires-Python`` are read. (flash-attn marks them ``Dynamic`` because
they come from setup.py, which is why uv will not trust them by itself; they are what its
setup.py declared when the sdist was made.)
"""

from __future__ import annotations

import hashlib
import logging
import tarfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from packaging.metadata import parse_email

from envbuild import scratch
from envbuild.errors import EnvironmentFailure, IntegrityError, ManifestError
from envbuild.lock.model import LockedFile

log = logging.getLogger(__name__)

#: PKG-INFO of a real sdist is a few kB plus the long description; refuse anything absurd.
_MAX_PKG_INFO = 16 << 20
_TIMEOUT = 120


@dataclass(frozen=True)
class SdistMetadata:
    requires_dist: list[str]
    requires_python: str | None


def sdist_metadata(sdist: LockedFile) -> SdistMetadata:
    """Download ``sdist`` (verifying its size and sha256) and read its top-level PKG-INFO."""
    log.info("reading the dependencies of %s from its PKG-INFO", sdist.name)
    with scratch.temp_dir("sdist-") as tmp:
        path = Path(tmp) / "sdist"
        _download(sdist, path)
        text = _pkg_info(path, sdist.name)
    raw, _unparsed = parse_email(text)
    return SdistMetadata(
        requires_dist=list(raw.get("requires_dist", [])),
        requires_python=raw.get("requires_python"),
    )


def _download(file: LockedFile, dest: Path) -> None:
    digest = hashlib.sha256()
    size = 0
    try:
        with urllib.request.urlopen(file.url, timeout=_TIMEOUT) as response, dest.open("wb") as out:
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
                out.write(chunk)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise EnvironmentFailure(
            f"cannot download {_public(file.url)}: {reason}",
            hint="check the network and the index URL in the spec",
        ) from None
    if size != file.size or digest.hexdigest() != file.hashes.sha256:
        raise IntegrityError(
            f"{file.name}: the index promised {file.size} bytes with sha256 "
            f"{file.hashes.sha256}, the download has {size} bytes with sha256 "
            f"{digest.hexdigest()}",
            hint="the index served other bytes than it lists; retry, or report it to the index",
        )


def _pkg_info(path: Path, name: str) -> str:
    """The sdist's ``<name>-<version>/PKG-INFO`` (the core metadata at the sdist's top)."""
    data: bytes | None = None
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                member = next((m for m in zf.namelist() if _is_top_pkg_info(m)), None)
                if member is not None and zf.getinfo(member).file_size <= _MAX_PKG_INFO:
                    data = zf.read(member)
        else:
            with tarfile.open(path, "r:*") as tf:
                for info in tf:
                    if _is_top_pkg_info(info.name) and info.isfile():
                        if info.size <= _MAX_PKG_INFO:
                            extracted = tf.extractfile(info)
                            data = extracted.read() if extracted else None
                        break
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as exc:
        raise ManifestError(f"{name}: not a readable sdist archive ({exc})") from None
    if data is None:
        raise ManifestError(
            f"{name}: the sdist has no PKG-INFO at its top, so its dependencies are unknown",
            hint="only sdists made by a standard build backend can be source builds",
        )
    return data.decode("utf-8", errors="replace")


def _is_top_pkg_info(member: str) -> bool:
    parts = PurePosixPath(member).parts
    return len(parts) == 2 and parts[1] == "PKG-INFO"


def _public(url: str) -> str:
    """``url`` without credentials, for messages."""
    parts = urllib.parse.urlsplit(url)
    if parts.username or parts.password:
        host = parts.hostname or ""
        if parts.port:
            host += f":{parts.port}"
        parts = parts._replace(netloc=host)
    return urllib.parse.urlunsplit(parts)


__all__ = ["SdistMetadata", "sdist_metadata"]
