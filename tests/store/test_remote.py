"""The remote cache (envbuild.store.remote) against a real registry: two stores sharing one cache
build a wheel once; what the cache holds is checked against its key and digests."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support.registry import Registry

from envbuild.errors import IntegrityError
from envbuild.registry.api import Endpoint
from envbuild.registry.ref import parse_repo
from envbuild.store.core import Derivation, Output, Store, derivation_key
from envbuild.store.remote import CachedStore, RemoteCache, cache_tag
from envbuild.store.verify import verify

pytestmark = pytest.mark.registry

CASE = Path(__file__).resolve().parent.parent / "cases" / "cache-cext"
EPOCH = (1980, 1, 1, 0, 0, 0)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def compile_wheel(work: Path, flags: list[str], salt: bytes = b"") -> Path:
    """Compile fastsum.c with cc and pack a wheel (fixed timestamps: the same bytes each time)."""
    work.mkdir(parents=True, exist_ok=True)
    lib = work / "libfastsum.so"
    subprocess.run(
        ["cc", "-shared", "-fPIC", *flags, "-o", str(lib), str(CASE / "fastsum.c")], check=True
    )
    files = {
        "fastsum/__init__.py": (CASE / "fastsum_init.py").read_bytes() + salt,
        "fastsum/libfastsum.so": lib.read_bytes(),
        "fastsum-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: fastsum\nVersion: 1.0\n",
        "fastsum-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
        b"Root-Is-Purelib: false\nTag: py3-none-linux_x86_64\n",
    }
    record = [_record_line(n, d) for n, d in files.items()] + ["fastsum-1.0.dist-info/RECORD,,"]
    files["fastsum-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = work / "fastsum-1.0-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(zipfile.ZipInfo(name, EPOCH), data)
    return wheel


class Counter:
    """A source build that counts how often it really ran."""

    def __init__(self, store: Store, work: Path, flags: list[str], salt: bytes = b"") -> None:
        self.store, self.work, self.flags, self.runs = store, work, flags, 0
        self.salt = salt

    def __call__(self) -> Output:
        self.runs += 1
        wheel = compile_wheel(self.work / f"run{self.runs}", self.flags, self.salt)
        return Output(outputs={"wheel": self.store.add_file(wheel)}, meta={"file": wheel.name})


def inputs(flags: list[str]) -> dict[str, object]:
    source = hashlib.sha256((CASE / "fastsum.c").read_bytes()).hexdigest()
    return {"name": "fastsum", "version": "1.0", "source": source, "cflags": flags}


def cache_for(reg: Registry, repo: str = "cache/envbuild") -> RemoteCache:
    return RemoteCache(parse_repo(reg.ref(repo)), endpoint=Endpoint(insecure=True))


def import_wheel(wheel: Path, where: Path) -> int:
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(where)
    spec = importlib.util.spec_from_file_location("fastsum", where / "fastsum" / "__init__.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules.pop("fastsum", None)
    return int(module.add(2, 40))


def test_two_stores_sharing_a_cache_build_the_wheel_once(
    registry: Registry, tmp_path: Path
) -> None:
    flags = ["-O2"]
    first = CachedStore(tmp_path / "machine-a", cache_for(registry))
    build_a = Counter(first, tmp_path / "work-a", flags)
    got_a = first.realize("sourcebuild", inputs(flags), build_a)
    assert (build_a.runs, got_a.reused) == (1, False)
    assert first.remote.stats.published == [got_a.drv.key]
    status, _ = registry.get(f"/v2/cache/envbuild/manifests/{cache_tag(got_a.drv.key)}")
    assert status == 200

    mark = registry.log_mark()
    second = CachedStore(tmp_path / "machine-b", cache_for(registry))
    build_b = Counter(second, tmp_path / "work-b", flags)
    got_b = second.realize("sourcebuild", inputs(flags), build_b)
    assert build_b.runs == 0  # pulled, not compiled
    assert got_b.reused is True
    assert second.remote.stats.hits == [got_a.drv.key]
    assert got_b.drv.outputs == got_a.drv.outputs
    assert got_b.drv.meta == {"file": "fastsum-1.0-py3-none-linux_x86_64.whl"}
    assert registry.uploads(mark) == []  # fetching uploads nothing
    assert verify(second).ok
    wheel = second.blob_path(got_b.drv.outputs["wheel"])
    assert "sha256:" + hashlib.sha256(wheel.read_bytes()).hexdigest() == got_a.drv.outputs["wheel"]
    assert import_wheel(wheel, tmp_path / "site") == 42

    # A third build on machine B is a plain local hit: the cache is not asked again.
    again = second.realize("sourcebuild", inputs(flags), build_b)
    assert again.reused and build_b.runs == 0 and second.remote.stats.hits == [got_a.drv.key]


def test_references_travel_with_the_record(registry: Registry, tmp_path: Path) -> None:
    """A record's references (what gc keeps with it) come back from the cache as they went up;
    a record without references is published as the bytes it always was."""
    parent = derivation_key("sourcebuild", inputs(["-O3"]))
    first = CachedStore(tmp_path / "a", cache_for(registry, "cache/references"))
    got = first.realize(
        "layer",
        {"wheel": parent},
        lambda: Output({"layer": first.add_bytes(b"tar")}, references=[parent]),
    )
    second = CachedStore(tmp_path / "b", cache_for(registry, "cache/references"))
    fetched = second.remote.fetch(second, got.drv.key)
    assert fetched is not None and fetched.references == [parent]
    assert (second.drvs / f"{got.drv.key}.json").read_bytes() == got.drv.record_json()
    plain = Derivation(key="0" * 64, kind="k", inputs={}, outputs={})
    assert b"references" not in plain.record_json()


def test_other_inputs_miss_the_cache(registry: Registry, tmp_path: Path) -> None:
    store = CachedStore(tmp_path / "s", cache_for(registry, "cache/miss"))
    build = Counter(store, tmp_path / "w", ["-O1"])
    store.realize("sourcebuild", inputs(["-O1"]), build)
    other = Counter(store, tmp_path / "w2", ["-O0"])
    got = store.realize("sourcebuild", inputs(["-O0"]), other)
    assert other.runs == 1 and not got.reused
    assert store.remote.stats.misses == [
        derivation_key("sourcebuild", inputs(["-O1"])),
        derivation_key("sourcebuild", inputs(["-O0"])),
    ]


def test_an_entry_filed_under_another_key_is_refused(registry: Registry, tmp_path: Path) -> None:
    cache = cache_for(registry, "cache/poisoned")
    store = CachedStore(tmp_path / "a", cache)
    real = store.realize("sourcebuild", inputs(["-O2"]), Counter(store, tmp_path / "w", ["-O2"]))
    wanted = derivation_key("sourcebuild", inputs(["-O3"]))
    # Someone with push access files the -O2 wheel under the -O3 key.
    subprocess.run(
        [
            "skopeo", "copy", "--preserve-digests", "--src-tls-verify=false",
            "--dest-tls-verify=false",
            f"docker://{registry.ref('cache/poisoned', cache_tag(real.drv.key))}",
            f"docker://{registry.ref('cache/poisoned', cache_tag(wanted))}",
        ],
        check=True, capture_output=True,
    )  # fmt: skip
    victim = CachedStore(tmp_path / "b", cache_for(registry, "cache/poisoned"))
    build = Counter(victim, tmp_path / "wb", ["-O3"])
    with pytest.raises(IntegrityError, match="inputs hash to another key"):
        victim.realize("sourcebuild", inputs(["-O3"]), build)
    assert victim.lookup(wanted) is None and build.runs == 0


def test_a_corrupt_cache_blob_is_refused(registry: Registry, tmp_path: Path) -> None:
    flags = ["-O2"]
    salt = b"# " + os.urandom(8).hex().encode() + b"\n"  # a blob no other test shares
    first = CachedStore(tmp_path / "a", cache_for(registry, "cache/corrupt"))
    got = first.realize("sourcebuild", inputs(flags), Counter(first, tmp_path / "w", flags, salt))
    blob = registry.blob_file(got.drv.outputs["wheel"])
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))

    second = CachedStore(tmp_path / "b", cache_for(registry, "cache/corrupt"))
    with pytest.raises(IntegrityError, match="does not match its digest"):
        second.realize("sourcebuild", inputs(flags), Counter(second, tmp_path / "wb", flags))
    assert second.lookup(got.drv.key) is None
    assert not second.has_blob(got.drv.outputs["wheel"])


def test_read_only_cache_does_not_publish(registry: Registry, tmp_path: Path) -> None:
    cache = RemoteCache(
        parse_repo(registry.ref("cache/readonly")), endpoint=Endpoint(insecure=True), push=False
    )
    store = CachedStore(tmp_path / "s", cache)
    got = store.realize("sourcebuild", inputs(["-Os"]), Counter(store, tmp_path / "w", ["-Os"]))
    assert cache.stats.published == []
    assert not cache.has(got.drv.key)


@pytest.mark.network
def test_a_corrupt_store_blob_is_never_published(registry: Registry, tmp_path: Path) -> None:
    flags = ["-O2"]
    store = Store(tmp_path / "plain")
    got = store.realize("sourcebuild", inputs(flags), Counter(store, tmp_path / "w", flags))
    blob = store.blob_path(got.drv.outputs["wheel"])
    blob.chmod(0o644)
    with blob.open("r+b") as f:
        f.write(b"X")
    cache = cache_for(registry, "cache/never-corrupt")
    mark = registry.log_mark()
    with pytest.raises(IntegrityError, match="store blob sha256:"):
        cache.publish(store, got.drv)
    assert registry.uploads(mark) == []
    status, _ = registry.get(f"/v2/cache/never-corrupt/manifests/{cache_tag(got.drv.key)}")
    assert status == 404
