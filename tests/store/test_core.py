"""Derivations: keys from their inputs, built once (also by two processes at once), reused,
built again when an output is lost or corrupt; the default store's location."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap

from envbuild.store.core import Output, Store, default_store, derivation_key


def test_derivation_key_is_canonical_and_versioned():
    a = derivation_key("layer", {"b": 1, "a": [1, 2]})
    assert a == derivation_key("layer", {"a": [1, 2], "b": 1})
    assert a != derivation_key("layer", {"a": [2, 1], "b": 1})
    assert a != derivation_key("base", {"a": [1, 2], "b": 1})
    expected = hashlib.sha256(
        b'{"inputs":{"a":[1,2],"b":1},"kind":"layer","store_format":1}'
    ).hexdigest()
    assert a == expected


def test_default_store_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("ENVBUILD_STORE", str(tmp_path / "s"))
    assert default_store().root == tmp_path / "s"
    monkeypatch.delenv("ENVBUILD_STORE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_store().root == tmp_path / "xdg" / "envbuild" / "store"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_store().root == tmp_path / "home" / ".cache" / "envbuild" / "store"


BUILDER = textwrap.dedent(
    """
    import os, sys, time
    from envbuild.store.core import Output, Store
    store = Store(sys.argv[1])
    def build():
        with open(sys.argv[2], "a") as f:
            f.write(f"{os.getpid()}\\n")
        time.sleep(1.0)
        return Output({"out": store.add_bytes(b"built once")}, {"note": "ok"})
    got = store.realize("test", {"x": 1}, build)
    print(got.drv.key, got.reused, got.drv.outputs["out"])
    """
)


def test_two_processes_build_one_derivation_once(tmp_path):
    store = Store(tmp_path / "store")
    log = tmp_path / "builds.log"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BUILDER, str(store.root), str(log)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=60)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len(log.read_text().splitlines()) == 1
    assert outs[0][0] == outs[1][0] == derivation_key("test", {"x": 1})
    assert sorted(o[1] for o in outs) == ["False", "True"]
    assert outs[0][2] == outs[1][2]


def test_build_reuses_recorded_outputs_and_rebuilds_lost_ones(tmp_path):
    store = Store(tmp_path / "store")
    calls = []

    def build() -> Output:
        calls.append(1)
        return Output({"out": store.add_bytes(b"content")}, {"n": len(calls)})

    first = store.realize("k", {"a": 1}, build)
    again = store.realize("k", {"a": 1}, build)
    assert (first.reused, again.reused, len(calls)) == (False, True, 1)
    assert again.drv == first.drv
    record = json.loads((store.drvs / f"{first.drv.key}.json").read_text())
    assert record["outputs"] == {"out": first.drv.outputs["out"]}
    store.blob_path(first.drv.outputs["out"]).unlink()
    assert store.realize("k", {"a": 1}, build).reused is False
    assert len(calls) == 2


def test_lookup_drops_a_corrupt_output_so_it_is_built_again(tmp_path):
    store = Store(tmp_path / "store")
    calls: list[int] = []

    def produce() -> Output:
        calls.append(1)
        return Output({"o": store.add_bytes(b"made")})

    got = store.realize("k", {}, produce)
    path = store.blob_path(got.drv.outputs["o"])
    os.chmod(path, 0o644)
    path.write_bytes(b"evil")
    again = store.realize("k", {}, produce)
    assert len(calls) == 2 and not again.reused
    assert store.read_blob(again.drv.outputs["o"]) == b"made"
    assert all(hashlib.sha256(p.read_bytes()).hexdigest() == p.name for p in store.blobs.iterdir())


def test_find_names_derivations_and_blobs_by_prefix(tmp_path):
    store = Store(tmp_path / "store")
    keys = [store.record("k", {"n": n}, {}).key for n in range(40)]
    common = max("0123456789abcdef", key=lambda c: sum(k.startswith(c) for k in keys))
    assert store.find(common) == sorted(k for k in keys if k.startswith(common))
    assert len(store.find(common)) > 1  # 40 keys over 16 first digits: some share one
    assert store.find(keys[0]) == [keys[0]]
    assert store.find(keys[0][:10]) == [keys[0]]
    digest = store.add_bytes(b"blob")
    assert store.find(digest[:12]) == [digest]
    assert store.find(digest) == [digest]
    assert store.find("sha256:") == [] and store.find("") == []
    assert store.find("flash-attn") == [] and store.find("*") == [] and store.find("A1") == []
    assert store.find(digest.removeprefix("sha256:")[:12]) == []  # a blob is not a derivation
