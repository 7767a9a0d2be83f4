"""The source-build fixtures of tests/cases/fixtures-src, packed as sdists."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "cases" / "fixtures-src"


def pack_sdist(src: Path, name: str, version: str, dest: Path) -> Path:
    """A deterministic sdist (``name-version.tar.gz``) of the folder ``src``."""
    top = f"{name.replace('-', '_')}-{version}"
    out = dest / f"{top}.tar.gz"
    pkg_info = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    with (
        gzip.GzipFile(out, "wb", mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        info = tarfile.TarInfo(f"{top}/PKG-INFO")
        info.size, info.mtime, info.mode = len(pkg_info), 315532800, 0o644
        tar.addfile(info, io.BytesIO(pkg_info))
        for path in sorted(src.rglob("*")):
            if path.is_dir() or "__pycache__" in path.parts:
                continue
            data = path.read_bytes()
            info = tarfile.TarInfo(f"{top}/{path.relative_to(src).as_posix()}")
            info.size, info.mtime, info.mode = len(data), 315532800, 0o644
            tar.addfile(info, io.BytesIO(data))
    return out
