"""gc: what roots keep stays, the rest goes; `envbuild gc`."""

from __future__ import annotations

import json

from envbuild.store.core import Output, Store
from envbuild.store.gc import collect


def test_gc_keeps_what_roots_name_and_removes_the_rest(tmp_path):
    store = Store(tmp_path / "store")
    kept = store.build("k", {"a": 1}, lambda: Output({"o": store.add_bytes(b"kept by drv")}))
    lone = store.add_bytes(b"kept by blob")
    manifest = store.add_bytes(
        json.dumps(
            {
                "config": {"digest": store.add_bytes(b"config")},
                "layers": [{"digest": store.add_bytes(b"layer")}],
            }
        ).encode()
    )
    dropped = store.build("k", {"a": 2}, lambda: Output({"o": store.add_bytes(b"garbage")}))
    store.set_root("img", blobs=[lone, manifest], derivations=[kept.drv.key])

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
