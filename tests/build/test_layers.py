"""Deterministic layers: the same tree gives the same bytes whatever the host did to it."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
from support.treelayer import layer_from_tree

from envbuild.build import layers as layers_mod
from envbuild.build.entries import Entry, Kind, whiteout
from envbuild.build.layers import Compression, write_layer
from envbuild.build.tarwrite import Sink, header
from envbuild.errors import LayerError, ToolFailed
from envbuild.oci.compression import open_uncompressed
from envbuild.store.core import Store

FILES = {
    "bin/tool": (b"#!/bin/sh\necho tool\n", True),
    "lib/python3.11/site-packages/pkg/__init__.py": (b"VALUE = 1\n", False),
    "lib/python3.11/site-packages/pkg/data.bin": (bytes(range(256)) * 5000, False),
    "lib/python3.11/site-packages/pkg-1.0.dist-info/RECORD": (b"pkg/__init__.py,,\n", False),
    "a-b/c": (b"sorted before a/", False),
    "x" * 120 + "/long-name-" + "y" * 120: (b"long", False),
    "unicode/caf\u00e9.txt": (b"cafe", False),
}


def make_tree(root: Path, *, umask: int, order_seed: int, mtime: int) -> None:
    old = os.umask(umask)
    try:
        items = list(FILES.items())
        random.Random(order_seed).shuffle(items)
        for rel, (data, executable) in items:
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            if executable:
                path.chmod(0o777 & ~umask)
            os.utime(path, (mtime, mtime))
        (root / "bin" / "link").symlink_to("tool")
        os.link(root / "bin" / "tool", root / "bin" / "tool-hard")
        (root / "empty-dir").mkdir()
    finally:
        os.umask(old)


PACK = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    from envbuild.build.entries import tree_entries
    from envbuild.build.layers import Compression, write_layer
    from envbuild.store.core import Store
    os.umask(0o077)
    out = {}
    for c in Compression:
        entries = tree_entries(Path(sys.argv[2]), prefix="opt/venv")
        layer = write_layer(Store(sys.argv[1]), entries, compression=c)
        out[c.value] = layer.model_dump(mode="json")
    print(json.dumps(out))
    """
)


def test_same_tree_gives_same_digests_across_stores_umask_tz_and_order(tmp_path):
    make_tree(tmp_path / "t1", umask=0o022, order_seed=1, mtime=1_000_000_000)
    make_tree(tmp_path / "t2", umask=0o077, order_seed=2, mtime=1_700_000_000)
    here = {
        c.value: layer_from_tree(
            Store(tmp_path / "s1"), tmp_path / "t1", prefix="opt/venv", compression=c
        ).model_dump(mode="json")
        for c in Compression
    }
    env = dict(os.environ, TZ="Asia/Tokyo", LC_ALL="C")
    done = subprocess.run(
        [sys.executable, "-c", PACK, str(tmp_path / "s2"), str(tmp_path / "t2")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    there = json.loads(done.stdout)
    assert here == there
    assert here["none"]["digest"] == here["none"]["diff_id"] == here["zstd"]["diff_id"]
    assert here["zstd"]["digest"] != here["gzip"]["digest"]


def test_the_mtime_given_is_every_members_mtime(tmp_path):
    """The build gives the plan's SOURCE_DATE_EPOCH (else 0), whatever the files' own times."""
    make_tree(tmp_path / "t", umask=0o022, order_seed=1, mtime=1_000_000_000)
    zero = layer_from_tree(Store(tmp_path / "s"), tmp_path / "t", compression=Compression.NONE)
    sde = layer_from_tree(
        Store(tmp_path / "s"), tmp_path / "t", compression=Compression.NONE, mtime=1_700_000_000
    )
    assert zero.diff_id != sde.diff_id
    listing = gnu_tar_listing(Store(tmp_path / "s").blob_path(sde.digest))
    assert {line.split()[3] for line in listing} == {"2023-11-14"}


def gnu_tar_listing(path: Path, *extra: str) -> list[str]:
    done = subprocess.run(
        ["tar", "-tv", "--full-time", "--numeric-owner", *extra, "-f", str(path)],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, TZ="UTC"),
    )
    return done.stdout.splitlines()


def test_gnu_tar_reads_the_layer_as_intended(tmp_path):
    make_tree(tmp_path / "t", umask=0o027, order_seed=3, mtime=1_234_567_890)
    store = Store(tmp_path / "s")
    layer = layer_from_tree(store, tmp_path / "t", prefix="opt/venv")
    raw = tmp_path / "layer.tar"
    with open_uncompressed(store.blob_path(layer.digest), layer.media_type) as f:
        raw.write_bytes(f.read())
    lines = gnu_tar_listing(raw)
    names = [line.split(None, 5)[5] for line in lines]
    paths = [n.split(" -> ")[0].split(" link to ")[0].rstrip("/") for n in names]
    assert paths == sorted(paths, key=os.fsencode)
    assert paths[:2] == ["opt", "opt/venv"]
    assert paths.index("opt/venv/a-b") < paths.index("opt/venv/bin")
    for line in lines:
        mode, owner, _size, date, time_ = line.split()[:5]
        assert owner == "0/0"
        assert (date, time_) == ("1970-01-01", "00:00:00")
        if mode.startswith("d"):
            assert mode == "drwxr-xr-x"
        elif mode.startswith("-"):
            assert mode in ("-rw-r--r--", "-rwxr-xr-x")
    by_name = dict(zip(paths, names, strict=True))
    assert by_name["opt/venv/bin/link"].endswith("-> tool")
    assert by_name["opt/venv/bin/tool-hard"].endswith("link to opt/venv/bin/tool")
    assert "opt/venv/" + "x" * 120 + "/long-name-" + "y" * 120 in paths
    assert "opt/venv/unicode/caf\u00e9.txt" in paths
    assert layer.files == len(FILES)
    assert layer.uncompressed_size == raw.stat().st_size
    assert layer.uncompressed_size % 10240 == 0
    unpack = tmp_path / "unpacked"
    unpack.mkdir()
    subprocess.run(["tar", "-xf", str(raw), "-C", str(unpack)], check=True)
    for rel, (data, _x) in FILES.items():
        assert (unpack / "opt/venv" / rel).read_bytes() == data


def test_whiteouts_and_refusals(tmp_path):
    store = Store(tmp_path / "s")
    layer = write_layer(
        store,
        [whiteout("opt/venv/old.py"), Entry("opt/venv/new.py", Kind.FILE, size=0)],
        compression=Compression.NONE,
    )
    names = [line.split(None, 5)[5] for line in gnu_tar_listing(store.blob_path(layer.digest))]
    assert names == ["opt/", "opt/venv/", "opt/venv/.wh.old.py", "opt/venv/new.py"]
    with pytest.raises(LayerError, match=r"'\.\.'"):
        write_layer(store, [Entry("a/../../etc/passwd", Kind.FILE)])
    with pytest.raises(LayerError, match="absolute"):
        write_layer(store, [Entry("/etc/passwd", Kind.FILE)])
    fifo = tmp_path / "tree"
    fifo.mkdir()
    os.mkfifo(fifo / "pipe")
    with pytest.raises(LayerError, match="fifo"):
        layer_from_tree(store, fifo)
    assert list(store.tmp.iterdir()) == []


@pytest.mark.parametrize(
    "entry",
    [
        Entry("a/b.py", Kind.FILE, 0o644, size=12345),
        Entry("bin/run", Kind.FILE, 0o4755, uid=0, gid=50, size=0),
        Entry("usr/lib", Kind.DIR, 0o755),
        Entry("tmp", Kind.DIR, 0o1777, uid=0, gid=0),
        Entry("bin/sh", Kind.SYMLINK, 0o777, linkname="dash"),
        Entry("a/hard", Kind.HARDLINK, 0o644, linkname="a/b.py"),
        Entry("caf\u00e9/\udcff-raw-byte", Kind.FILE, 0o600, uid=1000, gid=1000, size=1),
        Entry("x" * 99, Kind.FILE, 0o644, size=1),
        Entry("d" * 99, Kind.DIR, 0o755),  # 100 bytes with its slash: still fits
        Entry("long/" + "y" * 150, Kind.FILE, 0o644, size=7),
        Entry("l", Kind.SYMLINK, 0o777, linkname="t" * 200),
        Entry("h/" + "n" * 300, Kind.HARDLINK, 0o755, linkname="t/" + "k" * 511),
        Entry("n" * 101, Kind.FILE, 0o644, size=3),
        Entry("\u00e9" * 60, Kind.FILE, 0o644, size=3),  # 60 characters, 120 bytes
        Entry("d" * 100, Kind.DIR, 0o755),  # 101 bytes with its slash
        Entry("big", Kind.FILE, 0o644, size=9 * 1024**3),
        Entry("uid", Kind.FILE, 0o644, uid=3_000_000, size=1),
    ],
    ids=lambda e: e.path[:20],
)
def test_fast_headers_are_what_tarfile_writes(entry):
    for mtime in (0, 1_700_000_000):
        info = tarfile.TarInfo(entry.path + ("/" if entry.kind is Kind.DIR else ""))
        info.mtime, info.mode, info.uid, info.gid = mtime, entry.mode, entry.uid, entry.gid
        info.uname = info.gname = ""
        info.type = {
            Kind.FILE: tarfile.REGTYPE,
            Kind.DIR: tarfile.DIRTYPE,
            Kind.SYMLINK: tarfile.SYMTYPE,
            Kind.HARDLINK: tarfile.LNKTYPE,
        }[entry.kind]
        info.linkname = entry.linkname
        info.size = entry.size if entry.kind is Kind.FILE else 0
        assert header(entry, mtime) == info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")


def test_progress_counts_every_packed_byte(tmp_path):
    make_tree(tmp_path / "t", umask=0o022, order_seed=1, mtime=0)
    seen: list[int] = []
    layer = layer_from_tree(Store(tmp_path / "s"), tmp_path / "t", progress=seen.append)
    assert sum(seen) == layer.file_bytes == sum(len(d) for d, _x in FILES.values())


def test_a_file_of_another_size_than_its_stat_is_refused(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 3000)
    for size, exact in ((3000, True), (2999, False), (3001, False), (0, False)):
        sink = Sink(lambda _data: None)
        fd = os.open(path, os.O_RDONLY)
        try:
            assert sink.read_exact(fd, size) is exact
        finally:
            os.close(fd)


def test_a_failing_compressor_leaves_nothing(tmp_path, monkeypatch):
    tree = tmp_path / "t"
    make_tree(tree, umask=0o022, order_seed=1, mtime=0)
    (tree / "big.bin").write_bytes(os.urandom(3 << 20))
    store = Store(tmp_path / "s")
    failing = ["sh", "-c", "head -c 1000 >/dev/null; echo compressor broke >&2; exit 3"]
    monkeypatch.setattr(layers_mod, "_compress_argv", lambda _c, _l: failing)
    with pytest.raises(ToolFailed) as failed:
        layer_from_tree(store, tree)
    assert "compressor broke" in failed.value.output_tail
    assert list(store.tmp.iterdir()) == []
