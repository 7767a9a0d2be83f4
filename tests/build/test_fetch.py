"""The fetch stage: wheels into the store, checked against the lock."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.wheels import make_wheel, ref

from envbuild.build.fetch import fetch_wheels
from envbuild.errors import IntegrityError
from envbuild.store.core import Store


@pytest.fixture
def wheels(tmp_path: Path) -> dict[str, Path]:
    d = tmp_path / "wheels"
    return {
        "hello": make_wheel(d, "hello-tool", "1.0", {"hello_tool/__init__.py": ""}),
        "plain": make_wheel(d, "plain", "2.0", {"plain.py": "X = 1\n"}),
    }


def test_fetch_checks_size_and_sha256(tmp_path: Path, wheels: dict[str, Path]) -> None:
    store = Store(tmp_path / "store")
    good = ref(wheels["plain"])
    got = fetch_wheels([good], store)
    assert got[good.sha256].read_bytes() == wheels["plain"].read_bytes()
    # a second fetch reads nothing: the blob is there
    wheels["plain"].unlink()
    assert fetch_wheels([good], store) == got
    bad = ref(wheels["hello"])
    lie = type(bad)(bad.name, bad.version, bad.filename, bad.url, "0" * 64, bad.size)
    with pytest.raises(IntegrityError, match="the lock promises"):
        fetch_wheels([lie], store)
    assert not any(store.tmp.iterdir())
    assert not store.blob_path("sha256:" + "0" * 64).exists()
