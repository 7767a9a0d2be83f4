"""Tiny real wheels, written in a temp dir: dist-info with METADATA, WHEEL, RECORD and entry
points, laid out as PEP 427 says, so uv and the overlap detector read them like any other."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Mapping
from pathlib import Path

from envbuild.lock.wheels import WheelRef


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(
    directory: Path,
    name: str,
    version: str,
    files: Mapping[str, str | bytes],
    *,
    scripts: Mapping[str, str] | None = None,
    requires: tuple[str, ...] = (),
    dirs: tuple[str, ...] = (),
) -> Path:
    """Write ``<name>-<version>-py3-none-any.whl`` holding ``files`` (archive path -> content),
    console ``scripts`` (name -> ``module:function``) and ``dirs``: folders as the archive's own
    entries (``pkg/empty/``), which an installer makes even when no file is in them."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    members: dict[str, bytes] = {
        path: (content.encode() if isinstance(content, str) else content)
        for path, content in files.items()
    }
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    members[f"{info}/METADATA"] = meta.encode()
    members[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: envbuild-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    if scripts:
        lines = "".join(f"{k} = {v}\n" for k, v in sorted(scripts.items()))
        members[f"{info}/entry_points.txt"] = f"[console_scripts]\n{lines}".encode()
    record = "".join(f"{p},{_record_hash(d)},{len(d)}\n" for p, d in sorted(members.items()))
    record += f"{info}/RECORD,,\n"
    members[f"{info}/RECORD"] = record.encode()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for member, data in members.items():
            zi = zipfile.ZipInfo(member, date_time=(1980, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            zf.writestr(zi, data)
        for folder in dirs:
            zi = zipfile.ZipInfo(folder.rstrip("/") + "/", date_time=(1980, 1, 1, 0, 0, 0))
            zi.external_attr = (0o40755 << 16) | 0x10
            zf.writestr(zi, b"")
    return path


def ref(path: Path) -> WheelRef:
    """The lock's view of a wheel file (a file:// URL)."""
    name, version = path.name.split("-")[:2]
    data = path.read_bytes()
    return WheelRef(
        name.replace("_", "-"),
        version,
        path.name,
        path.resolve().as_uri(),
        hashlib.sha256(data).hexdigest(),
        len(data),
    )
