"""Install trees in the store: made whole or not at all, read-only, checked by stat and by
hash, kept by roots (a generation's lives while its folder is a generation) and never removed
while a file of theirs is linked."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from envbuild.fsio import sha256_file
from envbuild.store.core import Store
from envbuild.store.gc import collect, collect_trees
from envbuild.store.trees import TreeOf, Trees, tree_key

LAYOUT = {"python": "3.11", "installer": "uv 0.13.9", "venv": "uv venv --relocatable"}


def staged(tmp: Path, files: dict[str, bytes], *, executable: str = "") -> dict[str, Path]:
    out = {}
    for rel, data in files.items():
        path = tmp / "stage" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.chmod(path, 0o755 if rel == executable else 0o644)
        out[rel] = path
    return out


def make(store: Store, tmp: Path, wheel: str = "ab" * 32) -> str:
    key = tree_key(wheel, LAYOUT)
    files = {"lib/python3.11/site-packages/m/__init__.py": b"X = 1\n", "bin/tool": b"#!/bin/sh\n"}
    sources = staged(tmp, files, executable="bin/tool")
    digests = {rel: sha256_file(p) for rel, p in sources.items()}
    with store.session():
        Trees(store).create(
            key, TreeOf("m", "1", wheel, LAYOUT), sources=sources,
            digests=digests,
        )  # fmt: skip
    return key


def test_a_tree_is_read_only_and_its_manifest_says_what_it_holds(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    key = make(store, tmp_path)
    trees = Trees(store)
    manifest = trees.manifest(key)
    assert manifest is not None and set(manifest.files) == {
        "bin/tool",
        "lib/python3.11/site-packages/m/__init__.py",
    }
    assert manifest.files["bin/tool"].mode == 0o555
    assert stat.S_IMODE(os.lstat(trees.files(key) / "bin" / "tool").st_mode) == 0o555
    assert stat.S_IMODE(os.lstat(trees.files(key) / "bin").st_mode) == 0o555
    assert trees.quick_check(manifest) == [] and trees.verify(manifest) == []
    assert not list(store.tmp.iterdir())  # nothing left in the scratch space


def test_an_edit_is_found_by_stat_and_one_that_hides_its_mtime_by_hash(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    key = make(store, tmp_path)
    trees = Trees(store)
    manifest = trees.manifest(key)
    assert manifest is not None
    path = trees.files(key) / "lib/python3.11/site-packages/m/__init__.py"
    before = os.lstat(path)
    os.chmod(path, 0o644)
    path.write_bytes(b"X = 2\n")
    assert trees.quick_check(manifest) == ["lib/python3.11/site-packages/m/__init__.py"]
    os.chmod(path, 0o444)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # the same size, mtime, mode
    assert trees.quick_check(manifest) == []
    assert trees.verify(manifest) == ["lib/python3.11/site-packages/m/__init__.py"]


def test_gc_keeps_a_tree_a_live_generation_root_names(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    kept, dropped = make(store, tmp_path / "a"), make(store, tmp_path / "b", wheel="cd" * 32)
    generation = tmp_path / "generations" / "1-x"
    generation.mkdir(parents=True)
    (generation / "generation.json").write_text("{}")
    store.set_root("gen-1", trees=[kept], generation=generation)
    result = collect(store)
    assert result.removed_trees == [dropped] and Trees(store).all() == [kept]
    # the generation removed: its root no longer holds, and its tree goes
    (generation / "generation.json").unlink()
    result = collect(store)
    assert result.removed_roots == ["gen-1"] and result.removed_trees == [kept]
    assert Trees(store).all() == []


def test_a_tree_whose_file_is_still_linked_is_never_removed(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    key = make(store, tmp_path)
    os.link(Trees(store).files(key) / "bin" / "tool", tmp_path / "a-generation-s-link")
    dead, linked, _freed = collect_trees(store)
    assert dead == [] and linked == [key] and Trees(store).all() == [key]
    os.unlink(tmp_path / "a-generation-s-link")
    dead, linked, _freed = collect_trees(store)
    assert dead == [key] and linked == [] and Trees(store).all() == []


def test_an_image_root_is_written_as_it_always_was(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.set_root("img", blobs=["sha256:" + "0" * 64])
    text = (store.roots_dir / "img.json").read_text()
    assert '"trees"' not in text and '"generation"' not in text


@pytest.mark.parametrize("bad", ["../escape", "/abs", "a/../../b", "a//b", "./a"])
def test_a_tree_key_is_a_key_and_a_manifest_path_stays_inside(bad: str, tmp_path: Path) -> None:
    from envbuild.store.trees import read_manifest

    path = tmp_path / "m.json"
    path.write_text(
        '{"format": 1, "key": "' + "a" * 64 + '", "dist": "d", "version": "1", "wheel": null, '
        '"layout": {}, "files": {"' + bad + '": {"sha256": "00", "size": 1, "mode": 292, '
        '"mtime_ns": 1}}}'
    )
    assert read_manifest(path, "a" * 64) is None
    with pytest.raises(ValueError):
        Trees(Store(tmp_path / "store")).path("../x")
