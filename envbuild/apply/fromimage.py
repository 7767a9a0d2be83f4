"""A generation taken from the image CI pushed: the registry as a substituter, as Nix's binary
caches are.

Input: an image in a registry (``REGISTRY/REPO@sha256:…``, or found in ``REGISTRY/REPO`` by the
labels the build writes: ``dev.envbuild.spec-hash`` and ``dev.envbuild.lock-hash`` of the spec
and lock being applied). Output: a generation (:mod:`envbuild.apply.generations`) whose venv is
the image's venv (``/opt/venv``) file for file: bytes, modes less the write bits, symlinks,
empty folders.

Each of envbuild's layers above the base (its history says ``envbuild venv|dist|group|top|build|
patch …``; the base's layers are never fetched) becomes one read-only install tree in the store
(:mod:`envbuild.store.trees`), keyed by the layer's ``diff_id``: a tree the store holds already
(and whose files still have their recorded stat) is linked without asking the registry for
anything; otherwise the layer blob is fetched (unless the store has it), its size and sha256
checked as it arrives, decompressed within the base reader's limits, its uncompressed sha256
checked against the config's ``diff_id``, and every member passed through the one set of archive
rules (:mod:`envbuild.build.base.tarsafe`). No uv, no index, no wheel: the venv's scripts keep the
image's ``#!/opt/venv/bin/python`` (the unit runs them with the venv's interpreter), and
``bin/python`` leads to the image's interpreter, which must be on this machine, at the same path
and Python X.Y, or apply refuses (exit 2).
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from envbuild.apply import generations as gens
from envbuild.apply import shared
from envbuild.apply import unit as units
from envbuild.apply import venv as venvs
from envbuild.apply.imagesource import ImageLayer, ImageSource, fetch_blob
from envbuild.apply.inputs import ApplyInput
from envbuild.apply.paths import Paths
from envbuild.apply.realize import (
    Found,
    RealizedGeneration,
    find_reusable,
    finish_generation,
    interpreter_of,
    start_generation,
)
from envbuild.build.base.tarread import each_member, located, open_stream, open_tar
from envbuild.build.base.tarsafe import Tree
from envbuild.errors import EnvironmentFailure, IntegrityError, UserError
from envbuild.fsio import sha256_file, write_atomic
from envbuild.oci.blobs import layer_compression
from envbuild.snapshot import pyenv
from envbuild.spec.model import Spec
from envbuild.store.core import Store, derivation_key
from envbuild.store.trees import TreeManifest, TreeOf, Trees, copy_into

log = logging.getLogger(__name__)

TREE_KIND = "image-layer-tree"
#: Bump when what a tree made from an image layer holds changes.
TREE_FORMAT = 1
CHUNK = 1 << 20

# --- layers into trees ------------------------------------------------------------------------


def tree_key(layer: ImageLayer, venv: str) -> str:
    return derivation_key(
        TREE_KIND, {"format": TREE_FORMAT, "diff_id": layer.diff_id, "venv": venv}
    )


class _Hashing:
    def __init__(self, f: Any) -> None:
        self.f, self.h = f, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.h.update(data)
        return bytes(data)


def layer_tree(src: ImageSource, layer: ImageLayer, store: Store, tree: Tree) -> TreeManifest:
    """The install tree of one of the image's layers: the store's, else made from the layer."""
    trees = Trees(store)
    key = tree_key(layer, src.venv)
    manifest = trees.manifest(key) if trees.has(key) else None
    if manifest is not None and not trees.quick_check(manifest):
        src.traffic.trees_reused += 1
        return manifest
    if manifest is not None:
        log.warning("install tree %s of layer %s was changed: made again", key[:12], layer.name)
        trees.remove(key)
    compression = layer_compression(layer.media_type)
    if compression is None:
        raise UserError(f"{src.name}: layer {layer.digest} has media type {layer.media_type}")
    if not store.check_blob(layer.digest):
        fetch_blob(src.api, store, layer.digest, layer.size, src.traffic)
    blob = store.blob_path(layer.digest)
    if os.lstat(blob).st_size != layer.size:
        raise IntegrityError(f"{src.name}: layer {layer.digest} is not {layer.size} bytes")
    tree.where = f"{src.name} layer {layer.digest[:19]} ({layer.name})"
    prefix = src.venv.strip("/") + "/"
    with store.temp_dir(f"image-{layer.diff_id[7:19]}-") as work:
        files: dict[str, str] = {}
        digests: dict[str, str] = {}
        links: dict[str, str] = {}
        dirs: set[str] = set()
        with open_stream(blob, compression, tree) as raw:
            stream = _Hashing(raw)
            with located(tree), open_tar(stream, tree=tree) as tf:
                for m in each_member(tf):
                    path = tree.admit(m)
                    if path is None or (m.isdir() and prefix.startswith(path + "/")):
                        continue  # the root, opt/, opt/venv/
                    if not (path + "/").startswith(prefix) or path + "/" == prefix:
                        raise tree.refuse(f"member {m.name!r} lies outside the venv {src.venv}")
                    rel = path[len(prefix) :]
                    if os.path.basename(rel).startswith(".wh."):
                        raise tree.refuse(f"member {m.name!r} is a whiteout inside the venv")
                    if m.isdir():
                        dirs.add(rel)
                    elif m.issym():
                        links[rel] = m.linkname
                    elif m.isreg():
                        staged = f"{work}/{len(files)}"
                        fin, h = tf.extractfile(m), hashlib.sha256()
                        assert fin is not None
                        with open(staged, "xb") as out:
                            while data := fin.read(CHUNK):
                                h.update(data)
                                out.write(data)
                        os.chmod(staged, 0o555 if m.mode & 0o111 else 0o444)
                        files[rel], digests[rel] = staged, h.hexdigest()
                    else:
                        raise tree.refuse(f"member {m.name!r} is a {m.type!r}: not in a venv")
            while stream.read(CHUNK):
                pass
        if "sha256:" + stream.h.hexdigest() != layer.diff_id:
            raise IntegrityError(
                f"{src.name}: layer {layer.digest} does not uncompress to its diff_id "
                f"{layer.diff_id}",
                hint="the registry's copy is damaged; push the image again",
            )
        holding = {os.path.dirname(r) for r in [*files, *links]}
        holding |= {a for r in holding for a in _parents(r)}
        manifest = trees.create(
            key, TreeOf(layer.name, "", None, {"image_layer": layer.diff_id, "venv": src.venv}),
            sources=files, digests=digests, dirs=sorted(dirs - holding - {""}), links=links,
        )  # fmt: skip
    src.traffic.trees_made += 1
    return manifest


def _parents(rel: str) -> list[str]:
    out = []
    while rel := os.path.dirname(rel):
        out.append(rel)
    return out


def _versions(manifest: TreeManifest) -> dict[str, str]:
    """The distributions a tree holds and their versions, by their ``.dist-info`` folders in
    site-packages (``name-version.dist-info``, as installers name them)."""
    out = {}
    for rel in manifest.files:
        parts = rel.split("/")
        if len(parts) > 4 and parts[3].endswith(".dist-info") and parts[2] == "site-packages":
            name, _, version = parts[3][: -len(".dist-info")].rpartition("-")
            out[canonicalize_name(name)] = version
    return dict(sorted(out.items()))


def _dists(manifest: TreeManifest) -> list[str]:
    return list(_versions(manifest))


# --- the generation ---------------------------------------------------------------------------


def generation_hash(paths: Paths, inp: ApplyInput, src: ImageSource) -> str:
    return gens.content_hash(
        lock_text=inp.lock_text,
        spec_hash=inp.spec_hash,
        store_wheels={},
        machine={"hf_home": str(paths.hf_home), "secrets": str(paths.secrets)},
        image=src.digest,
    )


def reusable(paths: Paths, inp: ApplyInput, src: ImageSource, store: Store) -> Found:
    return find_reusable(paths, generation_hash(paths, inp, src), store=store)


def realize(
    paths: Paths, inp: ApplyInput, src: ImageSource, store: Store, found: Found | None = None
) -> RealizedGeneration:
    """Reuse the generation of this image that still verifies, or make one from its layers."""
    found = found or reusable(paths, inp, src, store)
    if found.generation is not None:
        return RealizedGeneration(found.generation, True, found.rejected)
    return RealizedGeneration(build(paths, inp, src, Store(store.root)), False, found.rejected)


def build(paths: Paths, inp: ApplyInput, src: ImageSource, store: Store) -> gens.Generation:
    chash = generation_hash(paths, inp, src)
    draft = start_generation(paths, inp, chash, f"the image {src.name}")
    number, final, tmp = draft.number, draft.final, draft.tmp
    spec = inp.spec
    venv = tmp / "venv"
    with store.session():  # gc waits: no tree goes before the generation's root names it
        tree = Tree(src.name)
        manifests = []
        for layer in src.layers:
            manifests.append(layer_tree(src, layer, store, tree))
            tree.next_layer()
        trees, winners, own, link_mode = _link(venv, manifests, store)
        _check_pyvenv(venv, spec, src)
        # source-built and patched distributions have the versions their layers hold (the
        # lock names the released ones; the build recorded what it made of them)
        made = {
            dist: version
            for layer, manifest in zip(src.layers, manifests, strict=True)
            if layer.kind in ("build", "patch")
            for dist, version in _versions(manifest).items()
        }
        packages = venvs.check_exact(venv, inp.lock, {}, made)
        unit_name = None
        if spec.serve is not None:
            unit_name = units.unit_name(spec.name)
            if not (venv / "bin" / "vllm").exists():
                raise EnvironmentFailure(f"[serve] runs `vllm serve`, but {src.name} has no vllm")
            settings = units.ServeSettings(
                generation=number, generation_path=final, venv=final / "venv",
                hf_home=paths.hf_home, env_file=paths.env_file(spec.name),
                python=final / "venv" / "bin" / "python",
            )  # fmt: skip
            write_atomic(tmp / unit_name, units.render_unit(spec, inp.spec_hash, settings))
        version = pyenv.probe(str(venv / "bin" / "python")).version
        own_files = ["spec.json", "pylock.toml", *([unit_name] if unit_name else [])]
        own_files += shared.link_manifests(tmp, store, trees)
        meta = gens.GenerationMeta(
            number=number, content_hash=chash, spec_name=spec.name, spec_hash=inp.spec_hash,
            lock_sha256=inp.lock_sha256, created=datetime.now(UTC).replace(microsecond=0),
            python=version, origin=inp.origin, spec_path=inp.spec_path, lock_path=inp.lock_path,
            unit=unit_name, packages=packages,
            files={rel: sha256_file(tmp / rel) for rel in own_files},
            interpreter=interpreter_of(venv, final / "venv", version),
            trees=trees, overlaps=winners, link_mode=link_mode, image=src.name,
            venv_files=shared.own_files(venv, own),
        )  # fmt: skip
        gen = finish_generation(paths, draft, meta, store, trees.values())
    log.info("generation %d is complete: %s (from %s)", number, final, src.name)
    return gen


def _link(
    venv: Path, manifests: list[TreeManifest], store: Store
) -> tuple[dict[str, str], dict[str, str], list[str], str]:
    """Lay the trees over ``venv`` in layer order (a later layer's file wins, as in the image).
    Returns dist -> tree key (a layer of several distributions names each), the winner of
    each path two layers hold, the venv's own files (the symlinks) and how files were put in
    place (a hard link; a reflink or a copy where the store is on another file system)."""
    trees = Trees(store)
    placed: set[str] = set()
    winners: dict[str, str] = {}
    own: set[str] = set()
    keys: dict[str, str] = {}
    modes: set[str] = set()
    venv.mkdir()
    for manifest in manifests:
        dists = _dists(manifest) or [manifest.dist]
        keys.update(dict.fromkeys(dists, manifest.key))
        base = trees.files(manifest.key)
        for rel in manifest.dirs:
            _not_below_a_link(rel, own, manifest)
            os.makedirs(venv / rel, mode=0o755, exist_ok=True)
        for rel in sorted(manifest.files):
            _not_below_a_link(rel, own, manifest)
            target = venv / rel
            if rel in placed or rel in own:
                os.unlink(target)
                winners[rel] = dists[0]
                own.discard(rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            modes.add(copy_into(base / rel, target))
            placed.add(rel)
        for rel, to in sorted(manifest.links.items()):
            _not_below_a_link(rel, own, manifest)
            target = venv / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if stat.S_ISDIR(_lstat_mode(target)):
                raise IntegrityError(f"layer {manifest.dist}: link {rel} would replace a folder")
            if os.path.lexists(target):
                os.unlink(target)
                placed.discard(rel)
            os.symlink(to, target)
            own.add(rel)
    mode = "copy" if "copy" in modes else "reflink" if "reflink" in modes else "hardlink"
    return dict(sorted(keys.items())), winners, sorted(own), mode


def _not_below_a_link(rel: str, links: set[str], manifest: TreeManifest) -> None:
    """Refuse a path below a symlink an earlier layer made. The archive rules refuse it while
    the layers are read; trees reused from the store (made from another image's layers) are
    not read again, so the rule is kept here too: nothing is written through a link."""
    for folder in _parents(rel):
        if folder in links:
            raise IntegrityError(
                f"layer {manifest.dist} ({manifest.key[:12]}): {rel} lies below the symlink "
                f"{folder} of a lower layer; refusing the image"
            )


def _lstat_mode(path: Path) -> int:
    try:
        return os.lstat(path).st_mode
    except OSError:
        return 0


def _check_pyvenv(venv: Path, spec: Spec, src: ImageSource) -> None:
    """The image's ``pyvenv.cfg`` must name the interpreter and Python the spec does (the
    labels tie the image to this spec; this ties the bytes to the labels)."""
    try:
        lines = (venv / "pyvenv.cfg").read_text().splitlines()
    except OSError as exc:
        raise IntegrityError(f"{src.name}: its venv has no pyvenv.cfg ({exc})") from exc
    cfg: Mapping[str, str] = {
        k.strip(): v.strip() for k, _, v in (line.partition("=") for line in lines)
    }
    if (
        cfg.get("executable") != spec.python.interpreter
        or cfg.get("version") != spec.python.version
    ):
        raise UserError(
            f"{src.name}: its venv runs Python {cfg.get('version')} at {cfg.get('executable')}, "
            f"its spec says {spec.python.version} at {spec.python.interpreter}"
        )
    if not stat.S_ISLNK(os.lstat(venv / "bin" / "python").st_mode):
        raise IntegrityError(f"{src.name}: its venv's bin/python is not a link to the interpreter")
