"""A source build's sdist: fetched and checked against the lock, patched, its build requirements.

:func:`fetch_sdist` downloads (or copies) the locked sdist and checks its sha256;
:func:`patch_sdist` applies the knowledge base's sdist patches (:mod:`envbuild.sourcebuild.inputs`)
to an unpacked copy and packs it again; :func:`build_system_requires` reads its
``[build-system] requires`` (the PEP 517 fallback when it declares none).
"""

from __future__ import annotations

import logging
import shutil
import tarfile
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from envbuild.errors import EnvironmentFailure, InputFileError, IntegrityError
from envbuild.fsio import sha256_file
from envbuild.sourcebuild.inputs import SOURCE_PATCHES, SdistPatch
from envbuild.sourcebuild.patches import apply_patch
from envbuild.sourcebuild.requests import FileRef

log = logging.getLogger(__name__)

#: The PEP 517 fallback when an sdist declares no build system (setuptools < 70.1 needs wheel).
DEFAULT_REQUIRES = ["setuptools>=40.8.0", "wheel"]


def fetch_sdist(sdist: FileRef, dest_dir: Path) -> Path:
    """Download (or copy, for ``file://``) the sdist and check its sha256."""
    dest = dest_dir / sdist.name
    parsed = urllib.parse.urlparse(sdist.url)
    try:
        if parsed.scheme == "file" or not parsed.scheme:
            shutil.copyfile(urllib.request.url2pathname(parsed.path), dest)
        else:
            import ssl

            from envbuild import __version__

            ctx = ssl.create_default_context(cafile=_ca_file())
            request = urllib.request.Request(
                sdist.url, headers={"User-Agent": f"envbuild/{__version__}"}
            )
            with (
                urllib.request.urlopen(request, timeout=120, context=ctx) as r,
                dest.open("wb") as f,
            ):
                shutil.copyfileobj(r, f, 1 << 20)
    except (OSError, ValueError) as exc:
        raise EnvironmentFailure(f"cannot fetch {sdist.name} from {sdist.url}: {exc}") from None
    got = sha256_file(dest)
    if got != sdist.sha256:
        raise IntegrityError(
            f"{sdist.name}: sha256 {got}, the lock promises {sdist.sha256}",
            hint="the index served other bytes than when the lock was made; relock",
        )
    return dest


def _ca_file() -> str | None:
    import os

    return os.environ.get("SSL_CERT_FILE") or None


def patch_sdist(
    sdist: Path, patches: list[SdistPatch], work: Path, *, folder: Path = SOURCE_PATCHES
) -> Path:
    """``sdist`` unpacked (tarfile's ``data`` filter: nothing outside, no devices or links
    out), patched with ``folder``'s files (GNU patch -p1, exactly or not at all) and packed
    again under its own name in ``work/patched``; ``sdist`` itself when there is nothing to
    apply."""
    if not patches:
        return sdist
    tree = work / "sdist-src"
    try:
        with tarfile.open(sdist) as tar:
            tar.extractall(tree, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise InputFileError(sdist.name, f"is not a readable sdist: {exc}") from None
    tops = [p for p in tree.iterdir() if p.is_dir()]
    if len(tops) != 1:
        raise InputFileError(sdist.name, "does not hold one top folder, as an sdist does")
    for patch in patches:
        path = folder / patch.name
        if sha256_file(path) != patch.sha256:
            raise IntegrityError(
                f"{path}: sha256 {sha256_file(path)}, the build's key holds {patch.sha256}",
                hint="the patch changed after the key was computed; run the build again",
            )
        apply_patch(tops[0], path, f"envbuild/spec/source-patches/{patch.name}")
    out = work / "patched" / sdist.name
    out.parent.mkdir()
    with tarfile.open(out, "w:gz") as tar:
        tar.add(tops[0], arcname=tops[0].name, filter=_reset)
    return out


def _reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def build_system_requires(sdist: Path) -> list[str]:
    """``[build-system] requires`` of an sdist, or the PEP 517 fallback."""
    try:
        with tarfile.open(sdist) as tar:
            member = next(
                (
                    m
                    for m in tar.getmembers()
                    if m.name.count("/") == 1 and m.name.endswith("/pyproject.toml")
                ),
                None,
            )
            if member is None:
                return list(DEFAULT_REQUIRES)
            f = tar.extractfile(member)
            data = tomllib.loads(f.read().decode()) if f else {}
    except (tarfile.TarError, OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputFileError(sdist.name, f"is not a readable sdist: {exc}") from None
    system = data.get("build-system")
    if not isinstance(system, dict):
        return list(DEFAULT_REQUIRES)
    requires = system.get("requires", [])
    return [str(r) for r in requires] if isinstance(requires, list) else []
