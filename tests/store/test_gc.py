"""gc: what roots and derivation records name stays, the rest goes (no blob is read to find
more); a store written before records had references; `envbuild gc`."""

from __future__ import annotations

import json

import pytest

from envbuild.store.core import Derivation, Output, Store, derivation_key
from envbuild.store.gc import collect


def test_gc_keeps_what_roots_name_and_removes_the_rest(tmp_path):
    store = Store(tmp_path / "store")
    kept = store.realize("k", {"a": 1}, lambda: Output({"o": store.add_bytes(b"kept by drv")}))
    lone = store.add_bytes(b"kept by blob")
    config, layer = store.add_bytes(b"config"), store.add_bytes(b"layer")
    manifest = store.add_bytes(
        json.dumps({"config": {"digest": config}, "layers": [{"digest": layer}]}).encode()
    )
    dropped = store.realize("k", {"a": 2}, lambda: Output({"o": store.add_bytes(b"garbage")}))
    store.set_root("img", blobs=[lone, manifest, config, layer], derivations=[kept.drv.key])

    dry = collect(store, dry_run=True)
    assert dry.removed_blobs == [dropped.drv.outputs["o"]]
    assert dry.removed_derivations == [dropped.drv.key]
    assert store.has_blob(dropped.drv.outputs["o"])

    done = collect(store)
    assert done.removed_blobs == dry.removed_blobs
    assert done.freed_bytes == len(b"garbage")
    assert not store.has_blob(dropped.drv.outputs["o"])
    assert store.lookup(dropped.drv.key) is None
    assert store.lookup(kept.drv.key) is not None
    assert {store.read_blob(d) for d in (lone,)} == {b"kept by blob"}
    assert done.kept_blobs == 5  # drv output, lone blob, manifest, its config and layer

    assert store.remove_root("img")
    collect(store)
    assert list(store.blobs.iterdir()) == []
    assert store.derivations() == []


def test_gc_command_reports_and_removes(tmp_path, cli):
    store = Store(tmp_path / "store")
    kept = store.add_bytes(b"kept")
    garbage = store.add_bytes(b"garbage")
    store.set_root("img", blobs=[kept])
    dry = cli("gc", "--store", store.root, "--dry-run", "--json")
    assert dry.exit_code == 0, dry.stderr
    assert dry.json()["removed_blobs"] == [garbage]
    assert store.has_blob(garbage)
    done = cli("gc", "--store", store.root)
    assert done.exit_code == 0
    assert f"removed blob {garbage}" in done.stdout
    assert "removed 1 blobs (7 B)" in done.stdout
    assert not store.has_blob(garbage) and store.has_blob(kept)


def test_a_blob_referenced_only_from_a_derivation_record_survives(tmp_path):
    """A rooted record keeps what it references, and that record's outputs; an unreferenced
    blob and an unrooted chain of records go."""
    store = Store(tmp_path / "store")
    wheel = store.realize("sourcebuild", {"n": 1}, lambda: Output({"wheel": store.add_bytes(b"w")}))
    layer = store.realize(
        "layer",
        {"wheel": wheel.drv.key},
        lambda: Output({"layer": store.add_bytes(b"tar")}, references=[wheel.drv.key]),
    )
    assert layer.drv.references == [wheel.drv.key]
    loose = store.add_bytes(b"referenced by nothing")
    orphan = store.realize(
        "sourcebuild", {"n": 2}, lambda: Output({"wheel": store.add_bytes(b"o")})
    )
    unrooted = store.realize(
        "layer",
        {"wheel": orphan.drv.key},
        lambda: Output({"layer": store.add_bytes(b"tar 2")}, references=[orphan.drv.key]),
    )
    store.set_root("img", derivations=[layer.drv.key])

    done = collect(store)
    assert store.lookup(layer.drv.key) is not None
    assert store.lookup(wheel.drv.key) is not None  # only the layer's record names it
    assert store.check_blob(wheel.drv.outputs["wheel"])
    assert sorted(done.removed_blobs) == sorted(
        [loose, orphan.drv.outputs["wheel"], unrooted.drv.outputs["layer"]]
    )
    assert sorted(done.removed_derivations) == sorted([orphan.drv.key, unrooted.drv.key])


def test_a_json_blob_naming_digests_keeps_nothing(tmp_path):
    """A rooted manifest (or any JSON) that names other blobs does not keep them: only what the
    root and the records state counts."""
    store = Store(tmp_path / "store")
    config, layer = store.add_bytes(b"config"), store.add_bytes(b"layer")
    drv = store.realize("k", {}, lambda: Output({"o": store.add_bytes(b"out")}))
    manifest = store.add_bytes(
        json.dumps(
            {
                "config": {"digest": config},
                "layers": [{"digest": layer}],
                "manifests": [{"digest": drv.drv.outputs["o"]}],
                "note": f"see {drv.drv.key}",
            }
        ).encode()
    )
    store.set_root("img", blobs=[manifest])
    done = collect(store)
    assert sorted(done.removed_blobs) == sorted([config, layer, drv.drv.outputs["o"]])
    assert done.removed_derivations == [drv.drv.key]
    assert store.check_blob(manifest)


def test_a_reference_must_be_a_derivation_key(tmp_path):
    store = Store(tmp_path / "store")
    digest = store.add_bytes(b"x")
    with pytest.raises(ValueError, match="not a derivation key"):
        store.record("k", {}, {"o": digest}, references=[digest])


def test_a_store_written_before_references_gcs_the_same(tmp_path):
    """The records of a store written before derivations had references, as bytes: a root that
    names an image's manifest, config and layers, and a record without ``references``. They are
    read as they are, gc keeps what they name, and a record without references is still
    written as the same bytes."""
    store = Store(tmp_path / "store")
    config, layer = store.add_bytes(b"config"), store.add_bytes(b"layer")
    manifest = store.add_bytes(
        json.dumps({"config": {"digest": config}, "layers": [{"digest": layer}]}).encode()
    )
    out, garbage = store.add_bytes(b"report"), store.add_bytes(b"garbage")
    key = derivation_key("overlaps", {"layers": [layer]})
    old_record = (
        "{\n"
        f'  "inputs": {{\n    "layers": [\n      "{layer}"\n    ]\n  }},\n'
        f'  "key": "{key}",\n'
        '  "kind": "overlaps",\n'
        '  "meta": {},\n'
        f'  "outputs": {{\n    "report": "{out}"\n  }},\n'
        '  "store_format": 1\n'
        "}\n"
    )
    (store.drvs / f"{key}.json").write_text(old_record)
    old_root = {
        "blobs": sorted([manifest, config, layer]),
        "derivations": [key],
        "files": {},
        "image": manifest,
        "name": "out-old",
        "output": None,
    }
    (store.roots_dir / "out-old.json").write_text(json.dumps(old_root, indent=2) + "\n")

    assert store.lookup(key) == Derivation(
        key=key, kind="overlaps", inputs={"layers": [layer]}, outputs={"report": out}
    )
    done = collect(store)
    assert done.removed_blobs == [garbage] and done.removed_derivations == []
    assert all(store.check_blob(d) for d in (manifest, config, layer, out))
    rewritten = store.record("overlaps", {"layers": [layer]}, {"report": out})
    assert (store.drvs / f"{key}.json").read_text() == old_record
    assert rewritten.references == []
