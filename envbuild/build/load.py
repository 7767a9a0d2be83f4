"""``envbuild load``: a build's docker archive into a Docker engine, through the docker SDK.

:func:`find_archive` turns what the user named (the tar, or a build's output folder) into the
archive; :func:`load_into_engine` loads it into the engine at ``base_url``, ``$DOCKER_HOST`` or
the default socket and says what the engine made of it (:class:`Loaded`), including whether
that engine could pull zstd images.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbuild.build.dockerarchive import DOCKER_ARCHIVE
from envbuild.errors import EnvironmentFailure, InputFileError, ToolNotFound

log = logging.getLogger(__name__)

API_VERSION = "1.41"
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"


@dataclass(frozen=True)
class Loaded:
    """What ``docker load`` made of an archive."""

    archive: str
    image_id: str
    tags: list[str]
    engine_version: str | None = None  # the engine's `docker version`, when it says
    reads_zstd: bool | None = None  # whether that engine can pull images with zstd layers

    def engine_note(self) -> str | None:
        """What to say when the engine cannot pull zstd images (``load`` itself works with any
        engine: the archive's layers are uncompressed)."""
        if self.reads_zstd is not False:
            return None
        return (
            f"this engine (Docker {self.engine_version}) cannot pull images with zstd layers "
            "('archive/tar: invalid tar header'): this load works (its layers are "
            "uncompressed), but for `docker pull` here build with --compression gzip"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "archive": self.archive,
            "image_id": self.image_id,
            "tags": self.tags,
            "engine_version": self.engine_version,
            "reads_zstd": self.reads_zstd,
        }


def find_archive(path: Path) -> Path:
    """The docker archive ``path`` names: the file itself, or ``DIR/docker-archive.tar`` of a
    build's output folder whose build finished."""
    path = Path(path)
    if path.is_file():
        return path
    if (path / "oci").is_dir() and not (path / "build-manifest.json").is_file():
        # a build output folder whose build did not finish: what it holds is not one image
        raise InputFileError(
            path,
            "holds an unfinished build (no build-manifest.json: a build into it was interrupted)",
            hint="build into it again (`envbuild build --output` this folder)",
        )
    candidate = path / DOCKER_ARCHIVE
    if candidate.is_file():
        return candidate
    if path.is_dir():
        raise InputFileError(
            path,
            f"holds no {DOCKER_ARCHIVE}",
            hint="point at the output folder of `envbuild build` (images/<spec>/) or at the tar",
        )
    raise InputFileError(path, "does not exist")


def _probe(url: str) -> None:
    """Fail early and cleanly when a unix socket does not answer (the docker SDK leaks the
    socket of a failed connection)."""
    if not url.startswith("unix://"):
        return
    path = url[len("unix://") :]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(10)
            probe.connect(path)
    except OSError as exc:
        raise EnvironmentFailure(
            f"no Docker engine answers at {url}: {exc.strerror or exc}",
            hint="start dockerd, or set DOCKER_HOST to an engine's socket",
        ) from exc


def load_into_engine(path: Path, *, base_url: str | None = None) -> Loaded:
    """``docker load`` the archive at ``path`` (a tar, or a build's output folder) through the
    docker SDK; the engine is ``base_url``, else ``$DOCKER_HOST``, else the default socket."""
    archive = find_archive(path)
    try:
        import docker  # type: ignore[import-untyped]
        import docker.errors  # type: ignore[import-untyped]
        import requests
    except ImportError as exc:  # pragma: no cover - docker is a dependency
        raise ToolNotFound("the docker SDK", hint="pip install docker") from exc
    where = base_url or os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST
    _probe(where)
    client = None
    try:
        # a fixed API version: "auto" asks the engine inside the constructor, and a failed
        # constructor leaks its socket. 1.41 (Docker 20.10) is served by every later engine.
        # loading gigabytes into a vfs engine takes minutes: the SDK's 60 s default is too short
        if base_url:
            client = docker.DockerClient(base_url=base_url, version=API_VERSION, timeout=1800)
        else:
            client = docker.from_env(version=API_VERSION, timeout=1800)
        client.ping()
        engine_version = str(client.version().get("Version") or "") or None
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        if client is not None:
            client.close()
        raise EnvironmentFailure(
            f"no Docker engine answers at {where}: {exc}",
            hint="start dockerd, or set DOCKER_HOST to an engine's socket",
        ) from exc
    try:
        with archive.open("rb") as f:
            images = client.images.load(f)
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise EnvironmentFailure(f"the engine at {where} refused {archive}: {exc}") from exc
    finally:
        client.close()
    if not images:
        raise EnvironmentFailure(f"the engine at {where} loaded no image from {archive}")
    image = images[0]
    from envbuild.registry.compat import reads_zstd

    zstd = reads_zstd("docker", engine_version) if engine_version else None
    return Loaded(str(archive), str(image.id), sorted(image.tags), engine_version, zstd)
