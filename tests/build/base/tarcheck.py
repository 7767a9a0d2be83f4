"""Independent checks of what a base reader let through (written apart from envbuild's rules, so
a bug in those cannot hide itself), and helpers that build archives the way attackers would."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import lzma
import os
import posixpath
import subprocess
import tarfile
from pathlib import Path

COMPRESSIONS = ("none", "gzip", "xz", "bzip2", "zstd")


def compress(raw: bytes, how: str) -> bytes:
    if how == "gzip":
        return gzip.compress(raw, mtime=0)
    if how == "xz":
        return lzma.compress(raw)
    if how == "bzip2":
        return bz2.compress(raw)
    if how == "zstd":
        return subprocess.run(
            ["zstd", "-q", "-c", "-3"], input=raw, capture_output=True, check=True
        ).stdout
    return raw


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def layer_members(data: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        return tf.getmembers()


def climbs_out(start: str, target: str, links: dict[str, str]) -> bool:
    """Whether the relative ``target`` of a symlink in folder ``start`` leaves the root, the
    plain recursive way: resolve one component at a time, following ``links``."""

    def walk(at: list[str], parts: list[str], depth: int) -> bool:
        if depth > 40:
            return True
        for i, part in enumerate(parts):
            if part in ("", "."):
                continue
            if part == "..":
                if not at:
                    return True
                at = at[:-1]
                continue
            here = "/".join([*at, part])
            if here in links:
                link = links[here]
                base = [] if link.startswith("/") else at
                rest = parts[i + 1 :]
                return walk(list(base), [*link.split("/"), *rest], depth + 1)
            at = [*at, part]
        return False

    return walk([p for p in start.split("/") if p], target.split("/"), 0)


def check_layer(members: list[tarfile.TarInfo]) -> None:
    """What a re-packed rootfs layer may hold: relative names without ``..``, every parent a
    directory, no device, fifo or sparse member, hardlinks to earlier files, relative symlinks
    that stay inside."""
    kinds: dict[str, str] = {}
    links: dict[str, str] = {}
    for m in members:
        name = m.name.rstrip("/")
        parts = name.split("/")
        assert not name.startswith("/") and ".." not in parts, name
        assert not (m.ischr() or m.isblk() or m.isfifo() or m.issparse()), name
        for i in range(1, len(parts)):
            assert kinds.get("/".join(parts[:i]), "dir") == "dir", name
        if m.isdir():
            kinds[name] = "dir"
        elif m.issym():
            kinds[name] = "symlink"
            links[name] = m.linkname
        elif m.islnk():
            assert kinds.get(m.linkname) == "file", (name, m.linkname)
            kinds[name] = "file"
        else:
            assert m.isreg(), name
            kinds[name] = "file"
    for name, target in links.items():
        assert target, name
        if not target.startswith("/"):
            assert not climbs_out(posixpath.dirname(name), target, links), (name, target)


def check_extracted(root: Path) -> None:
    """A folder extracted from a base: no device or fifo, relative symlinks stay inside."""
    links: dict[str, str] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            rel = str(path.relative_to(root))
            st = path.lstat()
            if path.is_symlink():
                links[rel] = os.readlink(path)
            else:
                assert path.is_dir() or path.is_file(), rel
            del st
    for name, target in links.items():
        if not target.startswith("/"):
            assert not climbs_out(posixpath.dirname(name), target, links), (name, target)


def listing(root: Path, skip: tuple[str, ...] = ()) -> list[str]:
    out = []
    for p in root.rglob("*"):
        rel = str(p.relative_to(root))
        if not rel.startswith(skip):
            out.append(rel)
    return sorted(out)


def pax_member(
    name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", link: str = ""
) -> tuple[tarfile.TarInfo, bytes]:
    """A member whose name (and link) travel in PAX ``path`` / ``linkpath`` records, as they
    are given (a NUL, or anything else, kept): the header's own fields say ``placeholder``."""
    info = tarfile.TarInfo("placeholder")
    info.type = kind
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    info.pax_headers = {"path": name}
    if link:
        info.linkname = "placeholder"
        info.pax_headers["linkpath"] = link
    return info, data


def pax_tar(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buf.getvalue()


def oci_layout(root: Path, layers_raw: list[bytes]) -> Path:
    """An OCI image layout at ``root`` holding one image of the (uncompressed) tar layers
    ``layers_raw``, gzip-compressed, with a config whose diff_ids match: what any tool writes."""
    import json

    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)

    def put(data: bytes, media_type: str) -> dict[str, object]:
        (blobs / sha256(data)).write_bytes(data)
        return {"mediaType": media_type, "digest": f"sha256:{sha256(data)}", "size": len(data)}

    layers = [put(gzip.compress(raw, mtime=0), "application/vnd.oci.image.layer.v1.tar+gzip")
              for raw in layers_raw]  # fmt: skip
    config = {
        "architecture": "amd64",
        "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{sha256(r)}" for r in layers_raw]},
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": put(json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json"),
        "layers": layers,
    }
    desc = put(json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [desc]}))
    return root
