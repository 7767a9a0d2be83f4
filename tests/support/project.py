"""Offline build projects: a spec with a tiny rootfs tarball base and its lock written with the
lock's own models, naming tiny wheels by ``file://`` URL (and source builds, patches, indexes)."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from envbuild.fsio import sha256_file
from envbuild.lock.check import patch_records
from envbuild.lock.core import lock_path
from envbuild.lock.io import dumps
from envbuild.lock.model import (
    EnvbuildLock,
    Hashes,
    Index,
    Lock,
    LockedBuild,
    LockedFile,
    LockedPackage,
    OciLayoutBaseLock,
    RootfsBaseLock,
    ToolTable,
)
from envbuild.lock.wheels import WheelRef
from envbuild.oci.compression import open_uncompressed
from envbuild.spec import load_spec
from envbuild.store.core import Store

PYPI = "https://pypi.org/simple"


def rootfs(repo: Path) -> Path:
    """A tiny root file system: a few directories and one file, as a tarball."""
    path = repo / "rootfs.tar"
    with tarfile.open(path, "w") as tf:
        for d in ("usr", "usr/bin", "etc"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tf.addfile(info)
        data = b"tiny\n"
        info = tarfile.TarInfo("etc/hostname")
        info.size, info.mode = len(data), 0o644
        tf.addfile(info, io.BytesIO(data))
    return path


def sdist_file(path: Path) -> LockedFile:
    """How a lock names an sdist (or any file) served by ``file://``."""
    return LockedFile(
        name=path.name,
        url=path.resolve().as_uri(),
        size=path.stat().st_size,
        hashes=Hashes(sha256=sha256_file(path)),
    )


def write_project(  # noqa: PLR0913
    repo: Path,
    name: str,
    wheels: list[WheelRef],
    extra: str = "",
    *,
    lie: str | None = None,
    base: Path | None = None,
    builds: Sequence[tuple[str, str, Path]] = (),
    index: str = PYPI,
    current: bool = False,
    digest: str | None = None,
) -> Path:
    """A spec with a rootfs base (``base``, default a tiny one; a folder: an OCI layout base)
    and its lock naming ``wheels`` (``lie``: a wrong sha256 for that one), the sdists of
    ``builds`` (``(name, version, sdist)``, flags from the spec's ``[builds.<name>.env]`` in
    ``extra``), the spec's patches and
    ``index`` as the default index. ``current``: the spec also asks for the wheels and names the
    index, so that `envbuild lock --check` (and `envbuild ci`) find the lock current. ``digest``:
    the image of an OCI layout base (default: the first its index lists)."""
    if base is None:
        base = repo / "rootfs.tar"
        if not base.exists():
            rootfs(repo)
    elif base.parent != repo:  # the spec may name files inside the repository only
        inside = repo / base.name
        if not inside.exists():
            try:
                os.link(base, inside)
            except OSError:
                shutil.copyfile(base, inside)
        base = inside
    spec_path, lock_path_ = f"../{base.name}", base.name
    spec = repo / "specs" / f"{name}.toml"
    if base.is_dir():  # an OCI layout: the image its index lists
        if digest is None:  # the image the index lists first
            digest = json.loads((base / "index.json").read_text())["manifests"][0]["digest"]
        pinned = f'[base]\nkind = "oci-layout"\npath = "{spec_path}"\ndigest = "{digest}"\n'
        base_lock: RootfsBaseLock | OciLayoutBaseLock = OciLayoutBaseLock(
            kind="oci-layout", path=lock_path_, digest=digest
        )
    else:
        pinned = f'[base]\nkind = "rootfs"\npath = "{spec_path}"\nsha256 = "{sha256_file(base)}"\n'
        base_lock = RootfsBaseLock(kind="rootfs", path=lock_path_, sha256=sha256_file(base))
    spec.write_text(
        pinned
        + '[python]\nversion = "3.11"\nplatform = "manylinux_2_36_x86_64"\n'
        '[image]\ncmd = ["python3"]\n'
        "[resolution]\nexclude_newer = 2025-01-01T00:00:00Z\n"
        + (f'index_url = "{index}"\n' if current else "")
        + extra
        + ("[packages]\n" + "".join(f'{w.canonical} = "=={w.version}"\n' for w in wheels)
           if current else "")
    )  # fmt: skip
    loaded = load_spec(spec)
    packages = [
        LockedPackage(
            name=w.canonical,
            version=w.version,
            wheels=[
                LockedFile(
                    name=w.filename,
                    url=w.url,
                    size=w.size,
                    hashes=Hashes(sha256="0" * 64 if w.canonical == lie else w.sha256),
                )
            ],
        )
        for w in sorted(wheels)
    ]
    if current:  # a real lock also names each source build's sdist as a package
        packages += [
            LockedPackage(name=dist, version=version, sdist=sdist_file(sdist), wheels=[])
            for dist, version, sdist in builds
        ]
        packages.sort(key=lambda p: p.name)
    locked_builds = [
        LockedBuild(
            name=dist,
            version=version,
            sdist=sdist_file(sdist),
            env=dict(loaded.spec.builds[dist].env),
        )
        for dist, version, sdist in builds
    ]
    lock = Lock(
        requires_python="==3.11.*",
        packages=packages,
        tool=ToolTable(
            envbuild=EnvbuildLock(
                spec=loaded.name,
                spec_hash=loaded.spec_hash(),
                python="3.11",
                platform="manylinux_2_36_x86_64",
                exclude_newer=datetime(2025, 1, 1, tzinfo=UTC),
                indexes=[Index(name="default", url=index)],
                requirements=sorted(
                    [f"{w.canonical}=={w.version}" for w in wheels]
                    + [f"{dist}=={version}" for dist, version, _ in builds if current]
                ),
                builds=locked_builds,
                patches=patch_records(loaded),
                base=base_lock,
            )
        ),
    )
    path = lock_path(loaded)
    path.parent.mkdir(exist_ok=True)
    path.write_text(dumps(lock, spec_file=f"specs/{name}.toml"))
    return spec


def members(store: Store, digest: str, media_type: str) -> dict[str, bytes]:
    """A layer's files (name -> content; b"" for what is not a regular file)."""
    out = {}
    with (
        open_uncompressed(store.blob_path(digest), media_type) as f,
        tarfile.open(fileobj=f, mode="r|") as tf,
    ):
        for m in tf:
            fh = tf.extractfile(m) if m.isfile() else None
            out[m.name] = fh.read() if fh else b""
    return out
