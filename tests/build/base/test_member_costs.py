"""What reading a base may cost: every rule of envbuild.build.base.tarsafe is linear in what it
reads, and the limits stop a hostile archive at the cheap point. Proven by counting (resolution
steps, headers parsed, memory held) rather than timing, except for two large cases that must
finish far under a generous bound (each took minutes before)."""

from __future__ import annotations

import gzip
import io
import tarfile
import time
import tracemalloc
from pathlib import Path

import pytest

from envbuild.build.base import rootfs
from envbuild.build.base.tarread import scan
from envbuild.build.base.tarsafe import PATH_MAX, Limits, Tree
from envbuild.errors import UnsafeArchive
from envbuild.store.core import Store

from .tarcheck import pax_member, pax_tar
from .test_base_rules import layout_of, rootfs_from, tar_bytes
from .test_bases import member

SYM = tarfile.SYMTYPE


def test_a_symlink_target_longer_than_linux_takes_is_refused_at_once(tmp_path: Path) -> None:
    """A 100,000-byte target took 75 s and was accepted (symlink(2) takes 4095 bytes)."""
    raw = pax_tar([pax_member("x", SYM, link="a/" * 50_000)])
    started = time.monotonic()
    with pytest.raises(UnsafeArchive, match="Linux takes at most 4095 bytes"):
        rootfs_from(tmp_path, raw)
    layout, pin = layout_of(tmp_path, [raw])
    with pytest.raises(UnsafeArchive, match="Linux takes at most 4095 bytes"):
        rootfs.from_oci_layout(Store(tmp_path / "s2"), layout, pin)
    assert time.monotonic() - started < 20  # generous: it is refused before any walk


def test_the_longest_target_linux_takes_is_accepted(tmp_path: Path) -> None:
    target = "d/" * ((PATH_MAX - 2) // 2) + "x"
    assert len(target) == PATH_MAX - 1
    assert rootfs_from(tmp_path, pax_tar([pax_member("x", SYM, link=target)])).layers


@pytest.mark.parametrize("parts", [100, 1000, 2000])
def test_resolving_a_symlink_takes_one_step_a_component(parts: int) -> None:
    """The walk was quadratic (a list popped at its head, a path joined at every step)."""
    tree = Tree("t")
    info = tarfile.TarInfo("link")
    info.type, info.linkname = SYM, "/".join(["d"] * parts)
    before = tree.steps[0] + tree.limits.steps_per_member
    tree.admit(info)
    assert before - tree.steps[0] == parts


def test_many_long_symlinks_finish_far_under_a_generous_bound(tmp_path: Path) -> None:
    """200 links 2,047 folders deep (the longest target Linux takes): each check of one took
    about a second before (a path joined and looked up again at every step), and each link is
    checked twice; now the whole tarball is read in well under the bound."""
    members = [member(f"l{i}", SYM, linkname="a/" * 2047) for i in range(200)]
    started = time.monotonic()
    assert rootfs_from(tmp_path, tar_bytes(members)).layers
    assert time.monotonic() - started < 15  # 43 s before, 1.3 s after (2 busy cores)


def test_link_chains_are_bounded_by_a_budget_of_steps(tmp_path: Path) -> None:
    """A chain of forty links of 1,600 parts each, named by many links: every one costs the
    whole chain (64,000 steps) to resolve. The walk is charged to a budget that grows with the
    members read."""
    members = [member("d", tarfile.DIRTYPE)]
    for i in range(40):
        members.append(member(f"c{i}", SYM, linkname="d/" * 800 + "../" * 800 + f"c{i + 1}"))
    members += [member(f"n{i}", SYM, linkname="c0") for i in range(50)]
    limits = Limits(steps_per_member=64, free_steps=100_000)
    with pytest.raises(UnsafeArchive, match="steps a member to resolve"):
        rootfs_from(tmp_path, tar_bytes(members), limits=limits)


def test_whiteouts_and_hardlinks_are_linear(tmp_path: Path) -> None:
    """A whiteout looked through every hardlink of its layer (and an opaque whiteout through
    every entry of its folder): 20,000 of each took minutes before."""
    n = 20_000
    lower = [member("d", tarfile.DIRTYPE)] + [member(f"d/f{i}", data=b"") for i in range(n)]
    upper = [member(f"h{i}", tarfile.LNKTYPE, linkname=f"d/f{i}") for i in range(0, n, 2)]
    upper += [member(f"d/.wh.f{i}") for i in range(1, n, 2)]
    upper += [member("e", tarfile.DIRTYPE)] + [member(f"e/g{i}") for i in range(n // 4)]
    upper += [member("e/.wh..wh..opq")] * (n // 4)
    layout, pin = layout_of(tmp_path, [tar_bytes(lower), tar_bytes(upper)])
    started = time.monotonic()
    assert len(rootfs.from_oci_layout(Store(tmp_path / "s"), layout, pin).layers) == 2
    assert time.monotonic() - started < 60


def _same_member(n: int) -> bytes:
    """``n`` copies of one empty file's header: the cheapest way to many members."""
    one = tar_bytes([member("f", data=b"")])
    return one[:512] * n + bytes(1024)


def test_too_many_members_are_refused_before_any_is_parsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3,000,000 members (29 MB of .tar.gz) took 238 s and 2.5 GB before they were refused:
    now the headers are counted first, without parsing any (each parse costs a hundred
    times more), and the limit is half what it was."""
    from envbuild.build.base.tarread import count_members

    parsed = []
    real = tarfile.TarInfo.frombuf.__func__  # type: ignore[attr-defined]

    def counting(cls: type, buf: bytes, encoding: str, errors: str) -> tarfile.TarInfo:
        parsed.append(1)
        return real(cls, buf, encoding, errors)

    monkeypatch.setattr(tarfile.TarInfo, "frombuf", classmethod(counting))
    data = gzip.compress(_same_member(300_000), compresslevel=1, mtime=0)
    with pytest.raises(UnsafeArchive, match=r"holds more than 100000 members \(the limit"):
        rootfs_from(tmp_path, data, "many.tar.gz", limits=Limits(max_members=100_000))
    assert parsed == []
    tree = Tree("t", Limits(max_members=299_999))
    (tmp_path / "plain.tar").write_bytes(_same_member(300_000))
    with pytest.raises(UnsafeArchive, match="more than 299999 members"):
        count_members(tmp_path / "plain.tar", tree)
    count_members(tmp_path / "plain.tar", Tree("t", Limits(max_members=300_000)))


def test_a_stream_reader_keeps_no_member(tmp_path: Path) -> None:
    """tarfile keeps every member it reads: a layer of millions of members held gigabytes.
    The memory a layer's reading holds does not grow with its members."""

    def peak(n: int) -> int:
        stream = io.BytesIO(_same_member(n))
        tracemalloc.start()
        try:
            scan(stream, Tree("t"))
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small, large = peak(2_000), peak(12_000)
    assert large < small + (1 << 20)  # tarfile's 10,000 more members held ~7 MB


def test_extended_headers_are_bounded_in_total(tmp_path: Path) -> None:
    """Each PAX header was bounded (1 MiB), their sum was not."""
    members = [pax_member(f"f{i}" + "/x" * 2000, data=b"") for i in range(40)]
    with pytest.raises(UnsafeArchive, match=r"extended .* headers"):
        rootfs_from(tmp_path, pax_tar(members), limits=Limits(max_header_bytes=64_000))
    assert rootfs_from(tmp_path, pax_tar(members), "ok.tar").layers


def test_too_many_members_are_refused_while_the_stream_is_decompressed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The headers are counted as the decompressed bytes pass: a .tar.gz of too many members is
    refused at the first header past the limit, with most of it never decompressed (the
    3,000,000-member case took 40 s decompressing all of it before counting)."""
    from envbuild.build.base import tarread

    passed: list[int] = []
    real = tarread._Bounded.read

    def read(self: tarread._Bounded, n: int = -1) -> bytes:
        data = real(self, n)
        passed.append(self.size)
        return data

    monkeypatch.setattr(tarread._Bounded, "read", read)
    whole = _same_member(300_000)
    data = gzip.compress(whole, compresslevel=1, mtime=0)
    with pytest.raises(UnsafeArchive, match=r"holds more than 100000 members \(the limit"):
        rootfs_from(tmp_path, data, "many.tar.gz", limits=Limits(max_members=100_000))
    assert passed and max(passed) < len(whole) // 2, (max(passed), len(whole))


@pytest.mark.parametrize("chunk", [1, 100, 511, 512, 513, 4096])
def test_the_stream_count_is_the_file_count_whatever_the_chunks(chunk: int) -> None:
    """Headers cut anywhere by the chunks the decompressor hands out are counted once each:
    the walk over a stream agrees with the walk over the file."""
    from envbuild.build.base.tarread import _HeaderWalk

    data = tar_bytes(
        [member(f"d{i}/f", data=b"x" * (i * 300)) for i in range(12)]
        + [member("long/" + "n" * 150, data=b"y" * 1000)]
    )
    walk = _HeaderWalk(Tree("t", Limits()))
    for at in range(0, len(data), chunk):
        walk.feed(data[at : at + chunk])
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        want = len(tf.getmembers())
    assert walk.count == want
    with pytest.raises(UnsafeArchive, match="more than"):
        tight = _HeaderWalk(Tree("t", Limits(max_members=want - 1)))
        for at in range(0, len(data), chunk):
            tight.feed(data[at : at + chunk])
