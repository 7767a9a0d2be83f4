"""Blobs: named by their digest, written atomically (a killed or starved writer leaves no
misnamed blob), shared by concurrent writers."""

from __future__ import annotations

import hashlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from envbuild.errors import IntegrityError, StoreError
from envbuild.store.core import Store
from envbuild.store.gc import collect
from envbuild.store.verify import verify


def blob_names_match_content(store: Store) -> bool:
    return all(hashlib.sha256(p.read_bytes()).hexdigest() == p.name for p in store.blobs.iterdir())


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
