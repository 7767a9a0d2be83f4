"""What a snapshot was built from: the spec (and its lock), and an image's build manifest.

The image folder (``images/<name>/``) is read generically: its build manifest is any JSON object,
recorded as it is, so a snapshot can be diffed against the build that made the machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envbuild.errors import ManifestError
from envbuild.fsio import sha256_bytes, sha256_file
from envbuild.snapshot.model import ImageRef, SpecRef, read_json

#: File names a build manifest may have in an image folder, in the order they are tried.
BUILD_MANIFEST_NAMES = ("build-manifest.json", "build.json", "manifest.json", "image.json")


def spec_ref(spec: str) -> SpecRef:
    from envbuild.lock import lock_path
    from envbuild.spec import load_spec

    loaded = load_spec(spec)
    lock = lock_path(loaded)
    return SpecRef(
        name=loaded.name,
        path=loaded.display(loaded.path),
        spec_hash=loaded.spec_hash(),
        lock_path=loaded.display(lock) if lock.is_file() else None,
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


def image_ref(image: str) -> ImageRef:
    manifest_file = find_build_manifest(Path(image))
    data: Any = read_json(manifest_file)
    if not isinstance(data, dict):
        raise ManifestError(f"{manifest_file}: a build manifest must be a JSON object")
    return ImageRef(
        path=image,
        manifest_file=manifest_file.name,
        manifest_sha256=sha256_bytes(manifest_file.read_bytes()),
        manifest=data,
    )
