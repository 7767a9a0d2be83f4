"""Checks of a build's output folder, and the build command line the output tests use."""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path


def build_args(repo: Path, spec: Path, out: Path, *extra: str) -> list[str]:
    return ["build", "--store", str(repo / "store"), "--output", str(out), *extra, str(spec)]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def folder_image(out: Path) -> str | None:
    """The image the folder says it holds (its build manifest), after checking that everything
    in it agrees; None when it has no build manifest (it says it holds nothing complete)."""
    try:
        manifest = json.loads((out / "build-manifest.json").read_bytes())
    except FileNotFoundError:
        return None
    index = json.loads((out / "oci" / "index.json").read_bytes())
    # the image, and beside it artifacts that refer to it (the SBOM: docs/image.md)
    images = [m["digest"] for m in index["manifests"] if "artifactType" not in m]
    assert images == [manifest["image"]]
    blobs = out / "oci" / "blobs" / "sha256"
    for path in blobs.iterdir():
        assert sha(path) == path.name, f"{path} does not hash to its name"
    image = json.loads((blobs / manifest["image"].split(":")[1]).read_bytes())
    assert image["config"]["digest"] == manifest["config"]
    assert [x["digest"] for x in image["layers"]] == [x["digest"] for x in manifest["layers"]]
    archive = out / "docker-archive.tar"
    assert archive.is_file() == ("docker_archive" in manifest["outputs"])
    if archive.is_file():
        with tarfile.open(archive) as tf:
            members = {m.name: m for m in tf.getmembers()}
            docker = json.loads(tf.extractfile(members["manifest.json"]).read())  # type: ignore[union-attr]
            assert docker[0]["Config"] == f"blobs/sha256/{manifest['config'].split(':')[1]}"
            for name, member in members.items():
                if name.startswith("blobs/sha256/") and member.isfile():
                    data = tf.extractfile(member).read()  # type: ignore[union-attr]
                    assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    return str(manifest["image"])
