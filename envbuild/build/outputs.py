"""The output folder: the image of a build (OCI layout, SBOM, docker archive) and its build
manifest, written so that the folder holds a complete image or says it does not.

``build-manifest.json`` is the folder's commit record. A build that will change the folder
removes it first, and with it everything else that names an image (``oci/index.json``, the
docker archive, the SBOM), and syncs the folder; then it places the layout's blobs, writes the
SBOM and the docker archive, then ``oci/index.json``, and the manifest last of all, each
atomically. A build killed on the way leaves a folder without a manifest, which no later build
calls current, ``envbuild load`` refuses (the folder or any file in it), and in which nothing
names an image that is not whole. Builds into one folder take turns by a lock in the folder
itself (:func:`guard_output`), whichever store each uses. The store's root of the folder
(:func:`envbuild.store.core.output_root_name`) records the stat of every file written (git's
index does the same for a work tree), so a no-op rebuild can tell without reading them that the
folder still holds the very image: same manifest, same ``index.json``, every blob the store's
own checked file or unchanged since it was written, the archive unchanged. Then nothing is
written.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbuild import __version__
from envbuild.build import dockerarchive, image, ocilayout
from envbuild.build.manifest import (
    MANIFEST_FILE,
    BaseResult,
    BuildManifest,
    BuiltLayer,
    PatchRecord,
    SourceBuildRecord,
    stored_layer,
)
from envbuild.build.plan import Plan
from envbuild.errors import OutputError
from envbuild.fsio import canonical_json, fsync_dir, write_atomic
from envbuild.oci import core as oci
from envbuild.store.blobs import FileGuard
from envbuild.store.core import Root, Store, output_root_name
from envbuild.store.stamps import file_stamp

log = logging.getLogger(__name__)

OCI_DIR = "oci"
#: The lock two builds into one folder take turns by (in the folder: their stores may differ).
GUARD_FILE = ".envbuild.lock"
#: The image's CycloneDX SBOM beside its layout (:mod:`envbuild.build.sbom`).
SBOM_FILE = "sbom.cdx.json"


@dataclass(frozen=True)
class Sbom:
    """What an output folder holds about its image besides the image: the SBOM document (the
    folder's ``sbom.cdx.json``) and the OCI 1.1 referrer that carries it in the layout."""

    data: bytes
    referrer: ocilayout.Referrer


@dataclass(frozen=True)
class Contents:
    """What an image is made of besides its plan: the base, each layer built (by name), the
    overlaps settled, and the source builds and patches the build manifest records."""

    base: BaseResult
    built: Mapping[str, BuiltLayer]
    overlaps: list[dict[str, Any]] = field(default_factory=list)
    source_builds: list[SourceBuildRecord] = field(default_factory=list)
    patches: list[PatchRecord] = field(default_factory=list)


def write_outputs(
    plan: Plan,
    store: Store,
    contents: Contents,
    out: Path,
    *,
    docker_archive: bool = True,
    created: str | None = None,
    sbom: Callable[[BuildManifest], Sbom] | None = None,
) -> BuildManifest:
    """Write the image of ``plan`` into the output folder ``out`` (the OCI layout, the docker
    archive, ``sbom(manifest)``'s document and referrer) and its build manifest last: a folder
    with a manifest holds all of it. A folder that already holds this very image is left as it
    is."""
    base = contents.base
    ours = [contents.built[layer.name] for layer in plan.layers]
    mine = [stored_layer(store, b) for b in ours]
    config = image.OciImageConfig(
        env=plan.config.env,
        cmd=plan.config.cmd,
        entrypoint=plan.config.entrypoint,
        labels=plan.config.labels,
        workdir=plan.config.workdir,
    ).merged_over(base.config)
    history = [
        *base.history,
        *(
            image.History(
                created_by=image.layer_history(f"envbuild {b.kind} {b.name}", b.distributions),
                comment=b.key,
            )
            for b in ours
        ),
    ]
    img = image.write_image(
        store, layers=[*base.layers, *mine], config=config, history=history, created=created
    )
    base_built = [
        BuiltLayer(
            name=f"base-{i}" if len(base.layers) > 1 else "base",
            kind="base",
            key=str(base.info.get("key", "")) if i == 0 else "",
            digest=x.digest,
            diff_id=x.diff_id,
            size=x.size,
            media_type=x.media_type,
            distributions=[],
        )
        for i, x in enumerate(base.layers)
    ]
    outputs = {"oci_layout": OCI_DIR, "manifest": MANIFEST_FILE}
    if docker_archive:
        outputs["docker_archive"] = dockerarchive.DOCKER_ARCHIVE
    if sbom is not None:
        outputs["sbom"] = SBOM_FILE
    manifest = BuildManifest(
        generator=f"envbuild {__version__}",
        spec=plan.spec,
        spec_hash=plan.spec_hash,
        lock_hash=plan.lock_hash,
        base={"kind": plan.base.kind, "description": plan.base.description, **base.info},
        source_date_epoch=plan.source_date_epoch,
        layers=[*base_built, *ours],
        overlaps=contents.overlaps,
        source_builds=contents.source_builds,
        patches=contents.patches,
        config=img.config_digest,
        image=img.manifest_digest,
        outputs=outputs,
    )
    # the caller holds guard_output(out) until the folder's root is written too
    _sweep_temps(out)
    made = sbom(manifest) if sbom is not None else None
    referrers = [made.referrer] if made is not None else []
    root = store.get_root(output_root_name(out))
    if _up_to_date(store, out, manifest, img, plan.spec, root, made):
        log.debug("%s is up to date", out)
        return manifest
    _invalidate(out)
    ocilayout.write_oci_layout(
        store,
        img,
        out / OCI_DIR,
        ref_name=plan.spec,
        keep=_unchanged(out, root, manifest),
        referrers=referrers,
        index=False,  # written once the archive is: until then nothing names the image
    )
    if made is not None:
        write_atomic(out / SBOM_FILE, made.data)
    if docker_archive:
        archive = out / dockerarchive.DOCKER_ARCHIVE
        dockerarchive.write_docker_archive(
            store,
            img,
            archive,
            repo_tags=[f"envbuild/{plan.spec}:latest"],
            mtime=plan.source_date_epoch,
        )
    ocilayout.write_index(out / OCI_DIR, img, plan.spec, referrers)
    write_atomic(out / MANIFEST_FILE, canonical_json(manifest.model_dump(mode="json")))
    fsync_dir(out)
    return manifest


def output_files(out: Path, manifest: BuildManifest) -> dict[str, str]:
    """The stat (:func:`envbuild.store.stamps.file_stamp`) of every file the build wrote into
    ``out``, by path relative to it: what the folder's root records."""
    names = [MANIFEST_FILE, f"{OCI_DIR}/index.json", f"{OCI_DIR}/oci-layout"]
    if "docker_archive" in manifest.outputs:
        names.append(dockerarchive.DOCKER_ARCHIVE)
    if "sbom" in manifest.outputs:
        names.append(SBOM_FILE)
    blob_dir = f"{OCI_DIR}/blobs/sha256"
    try:  # the image's blobs and its referrers': the layout holds no others once written
        held = sorted(p.name for p in (out / blob_dir).iterdir())
    except OSError:
        held = []
    names += [f"{blob_dir}/{name}" for name in held]
    stamps = {}
    for name in names:
        try:
            stamps[name] = file_stamp((out / name).stat())
        except FileNotFoundError:
            continue
    return stamps


def _image_blobs(manifest: BuildManifest, sbom: Sbom | None = None) -> list[str]:
    referred = sbom.referrer.blobs if sbom is not None else ()
    return sorted(
        {
            d.split(":", 1)[1]
            for d in (
                manifest.image,
                manifest.config,
                *(x.digest for x in manifest.layers),
                *referred,
            )
        }
    )


def _up_to_date(
    store: Store,
    out: Path,
    manifest: BuildManifest,
    img: image.Image,
    ref_name: str,
    root: Root | None,
    sbom: Sbom | None = None,
) -> bool:
    """The output dir already holds this very image, unchanged since this store wrote it (a
    no-op rebuild writes nothing)."""
    # byte for byte (what a build writes there is canonical), read no further than that: a
    # folder's files are not parsed, so whatever they hold cannot crash the check
    want = canonical_json(manifest.model_dump(mode="json")).encode()
    want_index = ocilayout.index_json(img, ref_name, [sbom.referrer] if sbom is not None else [])
    try:
        if (
            _head(out / MANIFEST_FILE, len(want)) != want
            or _head(out / OCI_DIR / "index.json", len(want_index)) != want_index
            or _head(out / OCI_DIR / "oci-layout", len(oci.OCI_LAYOUT)) != oci.OCI_LAYOUT
        ):
            return False
    except OSError:
        return False
    if (out / dockerarchive.DOCKER_ARCHIVE).is_file() != ("docker_archive" in manifest.outputs):
        return False
    if sbom is not None:
        try:
            if _head(out / SBOM_FILE, len(sbom.data)) != sbom.data:
                return False
        except OSError:
            return False
    elif (out / SBOM_FILE).exists():
        return False
    if root is None or root.image != manifest.image or root.output != str(out.absolute()):
        return False
    unchanged = _unchanged(out, root, manifest)
    for name in (MANIFEST_FILE, f"{OCI_DIR}/index.json", f"{OCI_DIR}/oci-layout"):
        if not unchanged(out / name):
            return False
    if "docker_archive" in manifest.outputs and not unchanged(out / dockerarchive.DOCKER_ARCHIVE):
        return False
    blob_dir = out / OCI_DIR / "blobs" / "sha256"
    for name in _image_blobs(manifest, sbom):
        digest = f"sha256:{name}"
        dest = blob_dir / name
        try:
            st = dest.lstat()
        except FileNotFoundError:
            return False
        try:
            linked = os.path.samestat(st, store.blob_path(digest).stat())
        except FileNotFoundError:
            linked = False
        if linked:  # the store's own file: its check is the store's
            if not store.check_blob(digest):
                return False
        elif not unchanged(dest):
            return False
    return True


def _head(path: Path, n: int) -> bytes:
    """The first ``n + 1`` bytes of ``path`` (enough to tell it is not ``n`` bytes long)."""
    with path.open("rb") as f:
        return f.read(n + 1)


def _unchanged(out: Path, root: Root | None, manifest: BuildManifest) -> Callable[[Path], bool]:
    """Whether a file under ``out`` has the stat the root recorded when this image was written
    there (False for any file when the root is of another image)."""
    recorded = root.files if root is not None and root.image == manifest.image else {}
    base = out.absolute()

    def unchanged(path: Path) -> bool:
        rel = Path(path).absolute().relative_to(base).as_posix()
        want = recorded.get(rel)
        if want is None:
            return False
        try:
            return file_stamp(Path(path).lstat()) == want
        except OSError:
            return False

    return unchanged


def guard_output(out: Path) -> FileGuard:
    """An exclusive lock on writing the output folder ``out`` (created when missing): builds
    into one folder take turns, whichever store each uses. The lock file is in the folder."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(
            f"cannot write {out}: {exc.strerror or exc}",
            hint="check that the folder is writable, or choose another with --output",
        ) from exc
    return FileGuard(out / GUARD_FILE, shared=False, what=f"another build into {out}")


#: What names an image in a folder, besides the manifest: removed with it, written after it all.
_NAMING = (f"{OCI_DIR}/index.json", dockerarchive.DOCKER_ARCHIVE, SBOM_FILE)


def _invalidate(out: Path) -> None:
    """Say the folder is being changed before changing it: its manifest goes first, then what
    else names an image (an index over blobs that are about to change would name an image
    that is not whole), and the removals reach the disk before any other write does."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / MANIFEST_FILE).unlink(missing_ok=True)
        fsync_dir(out)
        for name in _NAMING:
            (out / name).unlink(missing_ok=True)
        if (out / OCI_DIR).is_dir():
            fsync_dir(out / OCI_DIR)
        fsync_dir(out)
    except OSError as exc:
        raise OutputError(
            f"cannot write {out}: {exc.strerror or exc}",
            hint="check that the folder is writable, or choose another with --output",
        ) from exc


def _sweep_temps(out: Path) -> None:
    """Remove the temporary files a killed build left in the folder (``atomic_writer``'s
    ``.<name>.*.tmp`` of the files a build writes there: a docker archive's is gigabytes). The
    caller holds the folder's lock, so no build is writing them now."""
    ours = (MANIFEST_FILE, dockerarchive.DOCKER_ARCHIVE, SBOM_FILE, "index.json", "oci-layout")
    for folder in (out, out / OCI_DIR, out / OCI_DIR / "blobs" / "sha256"):
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            name = entry.name
            if not (name.startswith(".") and name.endswith(".tmp")):
                continue
            written = name[1:].rsplit(".", 2)[0]
            if written not in ours and not _HEX64.match(written):
                continue
            if entry.is_file(follow_symlinks=False):
                log.info("removing %s, left by a build that did not finish", entry.path)
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


_HEX64 = re.compile(r"^[0-9a-f]{64}$")
