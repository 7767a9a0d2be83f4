"""A build manifest reduced to facts: the packages it installs (from its layers, or a
``packages`` table), envbuild's patches, its layers and what it says it was built from."""

from __future__ import annotations

import logging
from typing import Any

from envbuild.errors import ManifestError
from envbuild.snapshot.diff.envfacts import patch_group, put_patches
from envbuild.snapshot.diff.facts import Fact, Side

log = logging.getLogger(__name__)


def _manifest_patch_facts(side: Side, data: dict[str, Any]) -> None:
    """A build manifest's ``patches`` (one record per patched distribution, see
    :class:`envbuild.build.manifest.PatchRecord`); a manifest from before patches has no such
    key."""
    records = data.get("patches")
    if not isinstance(records, list):
        return
    title = "patches (build manifest)"
    patch_group(side, "image", title)
    for rec in records:
        if isinstance(rec, dict) and isinstance(rec.get("dist"), str):
            patches = [p for p in rec.get("patches") or [] if isinstance(p, dict)]
            put_patches(side, "image", title, rec["dist"], patches)


def _packages_of(data: dict[str, Any]) -> dict[str, tuple[str, int | None]] | None:
    layers = data.get("layers")
    if "packages" not in data and isinstance(layers, list):
        # envbuild's build manifest: each layer lists the name==version it holds
        found: dict[str, tuple[str, int | None]] = {}
        for layer in layers:
            for item in layer.get("distributions", []) if isinstance(layer, dict) else []:
                name, sep, version = str(item).partition("==")
                if sep:
                    found[name] = (version, None)
        if found:
            return found
    for holder in (data, data.get("python"), data.get("lock")):
        if not isinstance(holder, dict) or "packages" not in holder:
            continue
        pkgs = holder["packages"]
        if isinstance(pkgs, dict):
            return {str(k): (str(v), None) for k, v in pkgs.items()}
        if isinstance(pkgs, list):
            out = {}
            for p in pkgs:
                if isinstance(p, dict) and "name" in p and "version" in p:
                    size = p.get("size") if isinstance(p.get("size"), int) else None
                    out[str(p["name"])] = (str(p["version"]), size)
            return out
    return None


def ref_facts(side: Side, data: dict[str, Any]) -> None:
    """What a build manifest says it was built from, and the image's digest."""
    title = "spec, lock and image"
    if isinstance(data.get("spec"), str) and isinstance(data.get("spec_hash"), str):
        side.put("refs", title, "spec", Fact(f"{data['spec']} {data['spec_hash'][:16]}"))
    if isinstance(data.get("lock_hash"), str):
        side.put("refs", title, "lock", Fact(data["lock_hash"]))
    if isinstance(data.get("image"), str):
        side.put("refs", title, "image", Fact(data["image"]))


def layer_facts(side: Side, data: dict[str, Any]) -> None:
    """A build manifest's layers, each with its digest and size."""
    layers = data.get("layers")
    if not isinstance(layers, list):
        return
    side.group("layers", "image layers")
    for i, layer in enumerate(layers):
        if isinstance(layer, dict):
            name = str(layer.get("name") or layer.get("id") or f"layer {i}")
            digest = str(layer.get("digest") or layer.get("diff_id") or "?")
            size = layer.get("size") if isinstance(layer.get("size"), int) else None
        else:
            name, digest, size = f"layer {i}", str(layer), None
        side.put("layers", "image layers", name, Fact(digest, size=size))


def setid_facts(side: Side, data: dict[str, Any]) -> None:
    """The setuid and setgid files a build manifest's base keeps (path -> octal mode); a
    manifest from before they were recorded has none."""
    base = data.get("base")
    setid = base.get("setid") if isinstance(base, dict) else None
    if not isinstance(setid, dict):
        return
    title = "setuid/setgid files (base)"
    side.group("setid", title)
    for path, mode in setid.items():
        side.put("setid", title, str(path), Fact(str(mode)))


def build_manifest_facts(data: dict[str, Any], label: str) -> Side:
    """A build manifest (envbuild's, or one that lists packages) reduced to facts: packages,
    patches, layers and what it was built from."""
    from packaging.utils import canonicalize_name

    side = Side(label, "build manifest")
    pkgs = _packages_of(data)
    if pkgs is not None:
        pk, pt = "packages image", "packages (build manifest)"
        side.group(pk, pt)
        for name, (version, size) in pkgs.items():
            side.put(pk, pt, canonicalize_name(name), Fact(version, size=size))
        python = data.get("python_version") or (data.get("python") or {}).get("version")
        if isinstance(python, str):
            side.put(pk, pt, "python", Fact(f"cpython {python}"))
    if pkgs is not None:
        _manifest_patch_facts(side, data)
    layer_facts(side, data)
    setid_facts(side, data)
    ref_facts(side, data)
    if not side.groups:
        raise ManifestError(
            f"{label}: neither a snapshot nor a build manifest with packages or layers",
            hint="pass a file written by `envbuild snapshot` or `envbuild build`",
        )
    return side
