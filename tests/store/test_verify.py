"""store verify: corrupt blobs and broken records found, named with their fix, repaired."""

from __future__ import annotations

import os

from envbuild.store.core import Output, Store
from envbuild.store.verify import verify


def test_verify_finds_and_repairs_a_corrupt_blob(tmp_path):
    store = Store(tmp_path / "store")
    got = store.realize("k", {}, lambda: Output({"o": store.add_bytes(b"good")}))
    assert verify(store).ok
    path = store.blob_path(got.drv.outputs["o"])
    os.chmod(path, 0o644)
    path.write_bytes(b"evil")
    report = verify(store, repair=True)
    assert report.corrupt == [got.drv.outputs["o"]]
    assert report.broken == [got.drv.key]
    assert verify(store).ok
    assert store.lookup(got.drv.key) is None


def test_verify_names_the_blob_its_derivation_and_the_fix(tmp_path, cli):
    store = Store(tmp_path / "store")
    got = store.realize("layer", {"x": 1}, lambda: Output({"layer": store.add_bytes(b"good")}))
    loose = store.add_bytes(b"a wheel")
    for digest in (got.drv.outputs["layer"], loose):
        path = store.blob_path(digest)
        os.chmod(path, 0o644)
        path.write_bytes(b"bad")
    (store.drvs / f"{'0' * 64}.json").write_text("{not json")
    result = cli("store", "verify", "--store", store.root, "--jobs", "2")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    layer_line = next(x for x in lines if x.startswith(f"blob {got.drv.outputs['layer']}"))
    assert f"output of layer {got.drv.key[:12]}" in layer_line and "fix: " in layer_line
    assert any(x.startswith(f"blob {loose}") for x in lines)
    assert any(x.startswith(f"derivation {'0' * 64}: its record is unreadable") for x in lines)
    assert "2 corrupt blob(s), 2 broken derivation(s)" in lines[-1]
    repaired = cli("store", "verify", "--store", store.root, "--repair", "--json")
    assert repaired.exit_code == 1 and repaired.json()["repaired"]
    assert cli("store", "verify", "--store", store.root).exit_code == 0
    assert cli("store", "verify", "--store", store.root, "--jobs", "0").exit_code == 2
