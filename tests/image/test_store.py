"""The content-addressed store: atomic blobs, derivations, locks, roots and gc."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from envbuild.errors import IntegrityError, StoreError
from envbuild.store import stamps
from envbuild.store.core import Output, Store, default_store, derivation_key
from envbuild.store.gc import collect
from envbuild.store.verify import verify


def blob_names_match_content(store: Store) -> bool:
    return all(hashlib.sha256(p.read_bytes()).hexdigest() == p.name for p in store.blobs.iterdir())


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


def test_blobs_are_named_by_their_digest(tmp_path):
    store = Store(tmp_path / "store")
    digest = store.add_bytes(b"hello")
    assert digest == "sha256:" + hashlib.sha256(b"hello").hexdigest()
    assert store.read_blob(digest) == b"hello"
    assert store.add_bytes(b"hello") == digest  # idempotent
    assert oct(store.blob_path(digest).stat().st_mode & 0o777) == "0o444"
    assert list(store.tmp.iterdir()) == []


def test_expected_digest_mismatch_stores_nothing(tmp_path):
    store = Store(tmp_path / "store")
    wrong = "sha256:" + "0" * 64
    with pytest.raises(IntegrityError):
        store.add_bytes(b"hello", expected=wrong)
    assert list(store.blobs.iterdir()) == []
    assert list(store.tmp.iterdir()) == []


WRITER = textwrap.dedent(
    """
    import sys, time
    from envbuild.store.core import Store
    store = Store(sys.argv[1])
    with store.blob_writer() as w:
        w.write(b"x" * 1_000_000)
        print("writing", flush=True)
        while True:
            w.write(b"y" * 1000)
            time.sleep(0.01)
    """
)


def test_a_killed_writer_leaves_no_misnamed_blob(tmp_path):
    store = Store(tmp_path / "store")
    store.add_bytes(b"an earlier blob")
    with subprocess.Popen(
        [sys.executable, "-c", WRITER, str(store.root)], stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "writing"
        time.sleep(0.2)
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert [p.name for p in store.blobs.iterdir()] == [
        hashlib.sha256(b"an earlier blob").hexdigest()
    ]
    assert blob_names_match_content(store)
    leftovers = list(store.tmp.iterdir())
    assert len(leftovers) == 1 and leftovers[0].stat().st_size >= 1_000_000
    result = collect(store)
    assert result.removed_temp == 1
    assert list(store.tmp.iterdir()) == []


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
    got = store.build("test", {"x": 1}, build)
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

    first = store.build("k", {"a": 1}, build)
    again = store.build("k", {"a": 1}, build)
    assert (first.reused, again.reused, len(calls)) == (False, True, 1)
    assert again.drv == first.drv
    record = json.loads((store.drvs / f"{first.drv.key}.json").read_text())
    assert record["outputs"] == {"out": first.drv.outputs["out"]}
    store.blob_path(first.drv.outputs["out"]).unlink()
    assert store.build("k", {"a": 1}, build).reused is False
    assert len(calls) == 2


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


def test_verify_finds_and_repairs_a_corrupt_blob(tmp_path):
    store = Store(tmp_path / "store")
    got = store.build("k", {}, lambda: Output({"o": store.add_bytes(b"good")}))
    assert verify(store).ok
    path = store.blob_path(got.drv.outputs["o"])
    os.chmod(path, 0o644)
    path.write_bytes(b"evil")
    report = verify(store, repair=True)
    assert report.corrupt == [got.drv.outputs["o"]]
    assert report.broken == [got.drv.key]
    assert verify(store).ok
    assert store.lookup(got.drv.key) is None


def test_a_full_disk_is_a_clear_store_error(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {done.stderr!r}")
    try:
        store = Store(mount / "store")
        small = store.add_bytes(b"fits")
        with pytest.raises(StoreError, match="no space left"), store.blob_writer() as w:
            for _ in range(1024):
                w.write(b"z" * 4096)
        assert [p.name for p in store.blobs.iterdir()] == [small.removeprefix("sha256:")]
        assert list(store.tmp.iterdir()) == []
        assert verify(store).ok
    finally:
        subprocess.run(["umount", str(mount)], check=False)


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


SAME_BLOB = textwrap.dedent(
    """
    import sys
    from envbuild.store.core import Store
    store = Store(sys.argv[1])
    data = bytes(range(256)) * 20000
    for i in range(20):
        assert store.add_bytes(data) == store.add_bytes(data)
        store.add_bytes(f"{sys.argv[2]}-{i}".encode())
    print("done")
    """
)


def test_concurrent_writers_of_the_same_blobs(tmp_path):
    store = Store(tmp_path / "store")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SAME_BLOB, str(store.root), str(n)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(3)
    ]
    assert [p.communicate(timeout=120)[0].strip() for p in procs] == ["done"] * 3
    assert blob_names_match_content(store)
    assert len(list(store.blobs.iterdir())) == 1 + 3 * 20
    assert list(store.tmp.iterdir()) == []


def test_a_blob_is_hashed_again_only_when_its_stat_changed(tmp_path, monkeypatch):
    """git's index: the stat recorded when the bytes were hashed; a hard link (ctime) alone is
    no change once noted, a write is one even when its mtime is set back."""
    store = Store(tmp_path / "store")
    digest = store.add_bytes(b"layer bytes" * 1000)
    path = store.blob_path(digest)
    hashed: list[object] = []
    real = stamps.Stamps.hash
    monkeypatch.setattr(stamps.Stamps, "hash", lambda self, p: hashed.append(p) or real(self, p))
    assert store.check_blob(digest) and hashed == []  # stamped when written
    fresh = Store(store.root)  # another process: reads the stamp file
    assert fresh.check_blob(digest) and hashed == []
    os.link(path, tmp_path / "out-link")  # an output folder's hard link changes the ctime
    store.linked(digest)
    assert Store(store.root).check_blob(digest) and hashed == []
    before = path.stat()
    os.chmod(path, 0o644)
    with path.open("r+b") as f:
        f.write(b"L")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # touch -d: mtime set back
    os.chmod(path, 0o444)
    assert not fresh.check_blob(digest) and hashed  # ctime shows the write
    with pytest.raises(IntegrityError, match=r"store blob sha256:\w+ \(a layer\)") as err:
        fresh.verified_path(digest, what="a layer")
    assert "envbuild store verify --repair" in (err.value.hint or "")
    with pytest.raises(IntegrityError):
        fresh.read_blob(digest)


def test_lookup_drops_a_corrupt_output_so_it_is_built_again(tmp_path):
    store = Store(tmp_path / "store")
    calls: list[int] = []

    def builder() -> Output:
        calls.append(1)
        return Output({"o": store.add_bytes(b"made")})

    got = store.build("k", {}, builder)
    path = store.blob_path(got.drv.outputs["o"])
    os.chmod(path, 0o644)
    path.write_bytes(b"evil")
    again = store.build("k", {}, builder)
    assert len(calls) == 2 and not again.reused
    assert store.read_blob(again.drv.outputs["o"]) == b"made"
    assert blob_names_match_content(store)


def test_verify_names_the_blob_its_derivation_and_the_fix(tmp_path, cli):
    store = Store(tmp_path / "store")
    got = store.build("layer", {"x": 1}, lambda: Output({"layer": store.add_bytes(b"good")}))
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
