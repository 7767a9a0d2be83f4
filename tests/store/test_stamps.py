"""Stat stamps: a blob is hashed again only when its stat changed since it was hashed."""

from __future__ import annotations

import os

import pytest

from envbuild.errors import IntegrityError
from envbuild.store import stamps
from envbuild.store.core import Store


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
