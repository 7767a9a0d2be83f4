"""The build's link check keeps each wheel's member map (by the wheel's sha256, the target and
what its layer leaves out) and each base's library listing (by its layers' digests) in the
link-check cache: a hit gives what reading the wheel or layer gives, a damaged entry (cut short,
bytes changed, another key's) is a miss, and another wheel or base is never served from it."""

from __future__ import annotations

import base64
import hashlib
import shutil
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envbuild.installed.venv import VenvTarget
from envbuild.linkcheck.reader import Cache
from envbuild.linkcheck.wheels import Wheel, base_system, member_key, wheel_entries
from tests.linkcheck.test_image_inputs import layer


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(
    path: Path, files: dict[str, bytes], compression: int = zipfile.ZIP_STORED
) -> tuple[Path, str]:
    with zipfile.ZipFile(path, "w", compression) as zf:
        rows = []
        for name, data in files.items():
            zf.writestr(name, data)
            rows.append(f"{name},{record_hash(data)},{len(data)}")
        zf.writestr("pkg-1.0.dist-info/RECORD", "\n".join(rows) + "\n")
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def entries_of(wheel: Path, sha: str | None, cache: Cache, work: Path, **kw: object) -> object:
    entries, names, owners = wheel_entries(
        [Wheel("pkg", "1.0", wheel, sha)],
        VenvTarget(),
        work,
        cache,
        **kw,  # type: ignore[arg-type]
    )
    # a member taken out lands under ``work``: compare what the check sees, not where
    return {k: (v[0] is not None, v[1]) for k, v in entries.items()}, names, owners


def damage(entry: Path, cut: bool, at: int) -> None:
    """Cut ``entry`` short at ``at``, or change one byte's case there (a path, a digest)."""
    data = bytearray(entry.read_bytes())
    at %= len(data)
    if not cut:
        data[at] ^= 0x20
    entry.write_bytes(bytes(data[:at] if cut else data))


def docs(cache: Path, kind: str) -> list[Path]:
    return sorted(cache.glob(f"v*/{kind}/*.json"))


FILES = {"pkg/_a.so": b"\x7fELF one", "pkg/b.py": b"x = 1\n", "pkg/libc.so.1": b"\x7fELF two"}


def test_a_wheel_map_hit_gives_what_the_wheel_gives(tmp_path: Path) -> None:
    wheel, sha = make_wheel(tmp_path / "pkg-1.0-py3-none-any.whl", FILES)
    plain = entries_of(wheel, None, Cache(None), tmp_path / "w0")
    cache = Cache(tmp_path / "cache")
    assert entries_of(wheel, sha, cache, tmp_path / "w1") == plain
    assert len(docs(tmp_path / "cache", "wheels")) == 1
    assert entries_of(wheel, sha, cache, tmp_path / "w2") == plain  # from the map
    # with its ELF members' facts cached too (by the wheel's sha256 and their names), a mapped
    # wheel is not even opened
    for member in ("pkg/_a.so", "pkg/libc.so.1"):
        cache.put(member_key(sha, member), None)
    wheel.unlink()
    entries, names, owners = entries_of(wheel, sha, cache, tmp_path / "w3")  # type: ignore[misc]
    assert entries == {
        k: (False, member_key(sha, k.split("site-packages/")[1]))
        for k in plain[0]  # type: ignore[index]
    }
    assert (names, owners) == plain[1:]  # type: ignore[index]


def test_leaves_and_another_wheel_are_other_keys(tmp_path: Path) -> None:
    wheel, sha = make_wheel(tmp_path / "pkg-1.0-py3-none-any.whl", FILES)
    cache = Cache(tmp_path / "cache")
    entries_of(wheel, sha, cache, tmp_path / "w1")
    leave = {"pkg": frozenset({"lib/python3.11/site-packages/pkg/_a.so"})}
    left = entries_of(wheel, sha, cache, tmp_path / "w2", leaves=leave)
    assert left == entries_of(wheel, None, Cache(None), tmp_path / "w3", leaves=leave)
    assert "/opt/venv/lib/python3.11/site-packages/pkg/_a.so" not in left[0]  # type: ignore[index]
    other, other_sha = make_wheel(tmp_path / "other.whl", {"pkg/_z.so": b"\x7fELF three"})
    got = entries_of(other, other_sha, cache, tmp_path / "w4")
    assert got == entries_of(other, None, Cache(None), tmp_path / "w5")
    assert len(docs(tmp_path / "cache", "wheels")) == 3


@settings(max_examples=25, deadline=None)
@given(cut=st.booleans(), at=st.integers(0, 10**6))
def test_a_damaged_wheel_map_is_a_miss(
    tmp_path_factory: pytest.TempPathFactory, cut: bool, at: int
) -> None:
    tmp = tmp_path_factory.mktemp("map")
    wheel, sha = make_wheel(tmp / "pkg-1.0-py3-none-any.whl", FILES)
    plain = entries_of(wheel, None, Cache(None), tmp / "w0")
    cache = Cache(tmp / "cache")
    entries_of(wheel, sha, cache, tmp / "w1")
    (entry,) = docs(tmp / "cache", "wheels")
    damage(entry, cut, at)
    assert entries_of(wheel, sha, cache, tmp / "w2") == plain


def test_a_wheel_map_of_another_key_is_a_miss(tmp_path: Path) -> None:
    wheel, sha = make_wheel(tmp_path / "pkg-1.0-py3-none-any.whl", FILES)
    other, other_sha = make_wheel(tmp_path / "other.whl", {"pkg/_z.so": b"\x7fELF three"})
    cache = Cache(tmp_path / "cache")
    entries_of(wheel, sha, cache, tmp_path / "w1")
    (mine,) = docs(tmp_path / "cache", "wheels")
    entries_of(other, other_sha, cache, tmp_path / "w2")
    (theirs,) = set(docs(tmp_path / "cache", "wheels")) - {mine}
    mine.write_bytes(theirs.read_bytes())  # a whole, valid entry, but another wheel's
    assert entries_of(wheel, sha, cache, tmp_path / "w3") == entries_of(
        wheel, None, Cache(None), tmp_path / "w4"
    )


def base(tmp: Path, libs: list[str]) -> list[tuple[Path, str]]:
    return [layer(tmp / "l.tar", [(f"usr/lib/x86_64-linux-gnu/{n}", "f", "") for n in libs])]


def test_a_base_listing_hit_and_another_base(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache")
    one = base(tmp_path, ["libc.so.6"])
    first = base_system(one, cache=cache, digests=["sha256:1"])
    assert first == base_system(one)
    (tmp_path / "l.tar").unlink()  # a hit reads no layer
    assert base_system(one, cache=cache, digests=["sha256:1"]) == first
    two = base(tmp_path, ["libm.so.6"])  # another base: its own digest, its own listing
    got = base_system(two, cache=cache, digests=["sha256:2"])
    assert got == base_system(two) != first


@settings(max_examples=25, deadline=None)
@given(cut=st.booleans(), at=st.integers(0, 10**6))
def test_a_damaged_base_listing_is_a_miss(
    tmp_path_factory: pytest.TempPathFactory, cut: bool, at: int
) -> None:
    tmp = tmp_path_factory.mktemp("base")
    cache = Cache(tmp / "cache")
    layers = base(tmp, ["libc.so.6", "libm.so.6"])
    plain = base_system(layers)
    base_system(layers, cache=cache, digests=["sha256:1"])
    (entry,) = docs(tmp / "cache", "base")
    damage(entry, cut, at)
    assert base_system(layers, cache=cache, digests=["sha256:1"]) == plain


def test_members_taken_out_in_parallel_are_the_last_wheels(tmp_path: Path) -> None:
    """Two wheels installing one path: the check reads the later wheel's bytes (it wins in the
    image, as with one wheel after another), whichever thread inflates first."""
    one, one_sha = make_wheel(tmp_path / "one.whl", {"pkg/_a.so": b"\x7fELF first" * 1000})
    two, two_sha = make_wheel(tmp_path / "two.whl", {"pkg/_a.so": b"\x7fELF second"})
    for cache in (Cache(None), Cache(tmp_path / "cache")):
        work = tmp_path / f"work-{cache.root is None}"
        entries, _, owners = wheel_entries(
            [Wheel("one", "1", one, one_sha), Wheel("two", "2", two, two_sha)],
            VenvTarget(),
            work,
            cache,
        )
        ((env, (path, digest)),) = entries.items()
        assert digest is None and path is not None
        assert Path(path).read_bytes() == b"\x7fELF second"
        assert owners[env] == ("two", "2")


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
@pytest.mark.parametrize("known", [True, False], ids=["wheel-sha256", "no-wheel-sha256"])
def test_elf_members_are_read_from_the_wheel_not_written_out(tmp_path: Path, known: bool) -> None:
    """A wheel's ELF members are inflated and read in memory: nothing lands under ``work``, and
    their facts are known to the check (also without a cache on disk). The entry names the
    member by its wheel's sha256 and its name when the wheel's sha256 is known (nothing hashed),
    else by the member's own sha256, computed."""
    from tests.linkcheck.test_rules import cc

    so = cc(tmp_path / "_ext.so", "int ext(void) { return 1; }\n", "-Wl,--no-as-needed", "-lm")
    data = so.read_bytes()
    wheel, sha = make_wheel(
        tmp_path / "pkg.whl", {"pkg/_ext.so": data, "pkg/x.py": b"x = 1\n"}, zipfile.ZIP_DEFLATED
    )
    for cache in (Cache(None), Cache(tmp_path / "cache")):
        work = tmp_path / f"work-{cache.root is None}"
        entries, names, _ = wheel_entries(
            [Wheel("pkg", "1.0", wheel, sha if known else None)], VenvTarget(), work, cache
        )
        ((env, (path, digest)),) = entries.items()
        assert env.endswith("/site-packages/pkg/_ext.so")
        want = member_key(sha, "pkg/_ext.so") if known else hashlib.sha256(data).hexdigest()
        assert path is None and digest == want
        assert not work.exists() or not any(work.rglob("*"))
        hit, info = cache.get(digest)
        assert hit and info is not None and "libm.so.6" in info.needed
        assert any(n.endswith("/pkg/x.py") for n in names)


def test_a_member_key_names_its_wheel_and_member(tmp_path: Path) -> None:
    """Another wheel or another member is another key; a RECORD that lies about a member's
    sha256 is not asked when the wheel's sha256 is known."""
    assert member_key("a" * 64, "pkg/_a.so") != member_key("b" * 64, "pkg/_a.so")
    assert member_key("a" * 64, "pkg/_a.so") != member_key("a" * 64, "pkg/_b.so")
    cache = Cache(tmp_path / "cache")
    other = b"\x7fELF another file"
    cache.put(hashlib.sha256(other).hexdigest(), None)  # facts of another file
    wheel = tmp_path / "pkg.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pkg/_a.so", b"\x7fELF bad")
        zf.writestr("pkg-1.0.dist-info/RECORD", f"pkg/_a.so,{record_hash(other)},17\n")
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    entries, _, _ = wheel_entries([Wheel("pkg", "1.0", wheel, sha)], VenvTarget(), tmp_path, cache)
    ((path, digest),) = entries.values()
    assert digest is None and path is not None  # read: not a readable ELF file, reported


def test_a_damaged_member_is_a_wheel_error(tmp_path: Path) -> None:
    """A member whose bytes do not match its CRC: exit 2 naming the wheel, not a traceback."""
    from envbuild.errors import InputFileError

    body = b"\x7fELF" + bytes(range(256)) * 64
    wheel, _ = make_wheel(tmp_path / "pkg.whl", {"pkg/_a.so": body})
    raw = bytearray(wheel.read_bytes())
    at = raw.index(b"\x7fELF")  # stored uncompressed by make_wheel (ZIP_STORED)
    raw[at + 100] ^= 0xFF
    wheel.write_bytes(bytes(raw))
    with pytest.raises(InputFileError, match=r"pkg\.whl"):
        wheel_entries([Wheel("pkg", "1.0", wheel, None)], VenvTarget(), tmp_path / "w", Cache(None))
