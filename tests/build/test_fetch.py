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


def test_ctrl_c_stops_the_downloads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C during a fetch: the downloads not started are dropped, those under way stop at
    their next chunk, and no blob or temporary file is left (the pool's exit would otherwise
    wait for every wheel to arrive)."""
    import hashlib
    import io
    import signal
    import threading
    import time

    from envbuild.build import fetch
    from envbuild.lock.wheels import WheelRef

    size = 200 * 1024  # 200 slow chunks: 1 s a wheel
    data = {f"https://example.invalid/w{i}": bytes([65 + i]) * size for i in range(6)}
    wheels = [
        WheelRef(url[-2:], "1.0", f"{url[-2:]}-1.0-py3-none-any.whl", url,
                 hashlib.sha256(body).hexdigest(), size)
        for url, body in data.items()
    ]  # fmt: skip
    opened: list[str] = []
    sent: list[bool] = []
    main = threading.main_thread().ident
    assert main is not None

    class Slow(io.BytesIO):
        def read(self, n: int | None = -1) -> bytes:
            time.sleep(0.005)
            if self.tell() == 10 * 1024 and not sent:  # Ctrl-C, in the thread it lands in
                sent.append(True)
                signal.pthread_kill(main, signal.SIGINT)
            return super().read(1024)

    def open_url(url: str, *, timeout: float = 60) -> Slow:
        opened.append(url)
        return Slow(data[url])

    monkeypatch.setattr(fetch, "open_url", open_url)
    store = Store(tmp_path / "store")
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            fetch_wheels(wheels, store, workers=2)
    finally:
        signal.signal(signal.SIGINT, old)
    assert time.monotonic() - start < 0.9  # not even one wheel's whole download
    assert len(opened) <= 2, opened
    left = store.tmp.iterdir() if store.tmp.exists() else iter(())
    assert not [p for p in left if p.name.startswith("blob-")]
    assert not any(store.blob_path(f"sha256:{w.sha256}").exists() for w in wheels)
