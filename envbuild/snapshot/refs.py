"""What a snapshot was built from: the spec (and its lock), and an image's build manifest.

The image folder (``images/<name>/``) is read generically: its build manifest is any JSON object,
recorded as it is, so a snapshot can be diffed against the build that made the machine. It is
validated first (:func:`check_build_manifest`): the one ``envbuild build`` writes against its
model, any other against the shape the diff reads.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Discriminator, Tag, ValidationError, model_validator

from envbuild.errors import ManifestError, NewerFormat
from envbuild.fsio import sha256_bytes, sha256_file
from envbuild.snapshot.jsonfile import read_json
from envbuild.snapshot.model.core import ImageRef, SpecRef, validation_summary

log = logging.getLogger(__name__)

#: File names a build manifest may have in an image folder, in the order they are tried.
BUILD_MANIFEST_NAMES = ("build-manifest.json", "build.json", "manifest.json", "image.json")


def spec_ref(spec: str) -> SpecRef:
    from envbuild.lock.core import find_lock
    from envbuild.spec import load_spec

    loaded = load_spec(spec)
    lock = find_lock(loaded)
    return SpecRef(
        name=loaded.name,
        path=loaded.repo_path(loaded.path),
        spec_hash=loaded.spec_hash(),
        lock_path=loaded.repo_path(lock) if lock.is_file() else None,
        lock_sha256=sha256_file(lock) if lock.is_file() else None,
    )


def find_build_manifest(path: Path) -> Path:
    if path.is_file():
        return path
    if not path.is_dir():
        raise ManifestError(f"{path}: no such image folder or build manifest")
    for name in BUILD_MANIFEST_NAMES:
        if (path / name).is_file():
            return path / name
    raise ManifestError(
        f"{path}: no build manifest in it (looked for {', '.join(BUILD_MANIFEST_NAMES)})",
        hint="pass the folder `envbuild build` wrote, or the manifest file itself",
    )


class _Loose(BaseModel):
    """The keys the diff reads have their types; anything else is left alone."""

    model_config = ConfigDict(extra="allow", frozen=True)


class _Package(_Loose):
    name: str
    version: str
    size: int | None = None


class _Layer(_Loose):
    name: str | None = None
    id: str | None = None
    digest: str | None = None
    diff_id: str | None = None
    size: int | None = None

    @model_validator(mode="after")
    def _has_a_digest(self) -> _Layer:
        if self.digest is None and self.diff_id is None:
            raise ValueError("a layer needs a digest")
        return self


# Each union below is checked in the one form the JSON type found calls for, so only that form's
# errors are shown. Its tags are ``<…>``, which no key has: :func:`validation_summary` drops them.


def _map_or_list(value: Any) -> str:
    return "<map>" if isinstance(value, dict) else "<list>"


def _text_or_object(value: Any) -> str:
    return "<text>" if isinstance(value, str) else "<object>"


_PackageList = Annotated[
    Annotated[list[_Package], Tag("<list>")] | Annotated[dict[str, str], Tag("<map>")],
    Discriminator(_map_or_list),
]
_LayerItem = Annotated[
    Annotated[_Layer, Tag("<object>")] | Annotated[str, Tag("<text>")],
    Discriminator(_text_or_object),
]


class _Packages(_Loose):
    packages: _PackageList | None = None


class _Python(_Packages):
    version: str | None = None


class _GenericManifest(_Packages):
    python: _Python | None = None
    lock: _Packages | None = None
    python_version: str | None = None
    layers: list[_LayerItem] | None = None


_GENERIC_HINT = (
    "a build manifest has `packages` (a list of {name, version, size?} or a {name: version} map; "
    "at the top or under `python` or `lock`) and/or `layers` (a list of {name?, digest, size?})"
)
_ENVBUILD_HINT = "build it again (`envbuild build`); build manifests are not edited by hand"


def is_envbuild_manifest(data: dict[str, Any]) -> bool:
    """The build manifest ``envbuild build`` writes
    (:class:`envbuild.build.manifest.BuildManifest`),
    whatever its format: it names its generator."""
    generator = data.get("generator")
    return isinstance(generator, str) and generator.startswith("envbuild ")


def check_build_manifest(data: dict[str, Any], source: str) -> None:
    """Refuse a build manifest this envbuild cannot read: one in a newer format
    (:class:`~envbuild.errors.NewerFormat`), or one whose keys do not have their types
    (:class:`~envbuild.errors.ManifestError` naming each bad key)."""
    from envbuild.build.manifest import MANIFEST_FORMAT, BuildManifest

    model: type[BaseModel] = _GenericManifest
    hint = _GENERIC_HINT
    if is_envbuild_manifest(data):
        fmt = data.get("format", MANIFEST_FORMAT)
        if isinstance(fmt, int) and not isinstance(fmt, bool) and fmt > MANIFEST_FORMAT:
            raise NewerFormat(
                f"{source}: build manifest format {fmt} is newer than this envbuild reads "
                f"(up to {MANIFEST_FORMAT})",
                hint="upgrade envbuild to read it",
            )
        model, hint = BuildManifest, _ENVBUILD_HINT
    try:
        model.model_validate(data)
    except ValidationError as exc:
        raise ManifestError(validation_summary(source, exc, "build manifest"), hint=hint) from exc


def image_ref(image: str) -> ImageRef:
    manifest_file = find_build_manifest(Path(image))
    data: Any = read_json(manifest_file)
    if not isinstance(data, dict):
        raise ManifestError(f"{manifest_file}: a build manifest must be a JSON object")
    check_build_manifest(data, str(manifest_file))
    return ImageRef(
        path=image,
        manifest_file=manifest_file.name,
        manifest_sha256=sha256_bytes(manifest_file.read_bytes()),
        manifest=data,
    )
