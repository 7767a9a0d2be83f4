"""``envbuild load``: a build's docker archive into a container engine.

:func:`find_archive` turns what the user named (the tar, or a build's output folder) into the
archive; :func:`load_into_engine` loads it into a :class:`~envbuild.engine.ContainerEngine` and
says what the engine made of it (:class:`Loaded`), including whether that engine could pull
zstd images.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbuild.build.dockerarchive import DOCKER_ARCHIVE
from envbuild.engine import ContainerEngine
from envbuild.errors import InputFileError

log = logging.getLogger(__name__)


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


def _unfinished(folder: Path) -> bool:
    """Whether ``folder`` is a build's output folder whose build did not finish (or is
    running): it has a layout but no build manifest, the folder's commit record."""
    return (folder / "oci").is_dir() and not (folder / "build-manifest.json").is_file()


def find_archive(path: Path) -> Path:
    """The docker archive ``path`` names: the file itself, or ``DIR/docker-archive.tar`` of a
    build's output folder whose build finished. Nothing in an unfinished output folder is
    loaded, the folder named or a file in it."""
    path = Path(path)
    whole = path.absolute()
    # the folder itself, the folder of a file in it, the folder of a file in its layout
    around = [whole, whole.parent, *(a.parent for a in whole.parents if a.name == "oci")]
    for folder in dict.fromkeys(around):
        if _unfinished(folder):
            # a build output folder whose build did not finish: what it holds is not one image
            raise InputFileError(
                path,
                "holds an unfinished build (no build-manifest.json: a build into it was "
                "interrupted)"
                if folder == whole
                else f"is in {folder}, which holds an unfinished build (no build-manifest.json: "
                "a build into it was interrupted or is running)",
                hint=f"build into it again (`envbuild build --output {folder}`)",
            )
    if path.is_file():
        return path
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


def load_into_engine(path: Path, engine: ContainerEngine) -> Loaded:
    """``docker load`` the archive at ``path`` (a tar, or a build's output folder) into
    ``engine``, and say what the engine made of it."""
    archive = find_archive(path)
    engine_version = engine.version()
    image = engine.load(archive)
    from envbuild.registry.compat import reads_zstd

    zstd = reads_zstd("docker", engine_version) if engine_version else None
    return Loaded(str(archive), image.id, image.tags, engine_version, zstd)
