"""A layer's staging tree gives the link-check cache what its wheels give: the entry written
from an installed file is the one the links stage writes from the wheel's member, under the
same key; a file the layer changed, or left out, is not recorded under the member's key."""

from __future__ import annotations

import hashlib
import shutil
import zipfile
from pathlib import Path

import pytest
from support.wheels import ref

from envbuild.build.install import install
from envbuild.installed.venv import VenvTarget
from envbuild.linkcheck.reader import CACHE_FORMAT, Cache
from envbuild.linkcheck.staging import Staged, record_staged
from envbuild.linkcheck.wheels import Wheel, map_key, member_key, wheel_entries
from tests.linkcheck.test_map_cache import record_hash
from tests.linkcheck.test_rules import cc

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

SO = "pkg/_ext.cpython-311-x86_64-linux-gnu.so"
TOOL = "pkg-1.0.data/scripts/tool"  # executable, not .py: a member the check may read


def wheel(tmp: Path) -> Path:
    """A real wheel (uv installs it): an extension built by gcc, a small executable that is
    not ELF, and a script whose shebang the install rewrites."""
    so = cc(tmp / "cc" / "_ext.so", "int ext(void) { return 1; }\n", "-Wl,--no-as-needed", "-lm")
    files = {
        SO: so.read_bytes(),
        "pkg/helper": b"#!/bin/sh\necho helper\n",
        "pkg/__init__.py": b"",
        TOOL: b"#!python\nprint('tool')\n",
        "pkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n",
        "pkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    path = tmp / "wheels" / "pkg-1.0-py3-none-any.whl"
    path.parent.mkdir(parents=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zi = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            zi.external_attr = (0o755 if name in (SO, TOOL, "pkg/helper") else 0o644) << 16
            zf.writestr(zi, data)
        rows = "".join(f"{n},{record_hash(d)},{len(d)}\n" for n, d in files.items())
        zf.writestr("pkg-1.0.dist-info/RECORD", rows + "pkg-1.0.dist-info/RECORD,,\n")
    return path


def entries(cache: Path) -> dict[str, bytes]:
    """Every entry of a cache folder, by its path in it."""
    top = cache / f"v{CACHE_FORMAT}"
    return {str(p.relative_to(top)): p.read_bytes() for p in sorted(top.rglob("*")) if p.is_file()}


def test_a_staged_entry_is_the_one_the_wheel_gives(tmp_path: Path) -> None:
    path = wheel(tmp_path)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    target = VenvTarget()
    root = tmp_path / "root"
    install([(ref(path), path)], target, root)
    staged = Cache(tmp_path / "staged")
    got = record_staged(root, [Wheel("pkg", "1.0", path, sha)], target, staged)
    # the extension and the helper are the members' bytes; the script's shebang was rewritten
    assert got == Staged(recorded=2, known=0, left=1)
    from_wheel = Cache(tmp_path / "wheel")
    wheel_entries([Wheel("pkg", "1.0", path, sha)], target, tmp_path / "work", from_wheel)
    made, read = entries(tmp_path / "staged"), entries(tmp_path / "wheel")
    tool = member_key(sha, TOOL)
    assert not any(tool in name for name in made)  # the rewritten file is not the member
    assert {k: v for k, v in read.items() if tool not in k} == made  # byte for byte
    for member in (SO, "pkg/helper"):
        assert any(member_key(sha, member) in name for name in made)
    hit, info = staged.get(member_key(sha, SO))
    assert hit and info is not None and "libm.so.6" in info.needed
    assert staged.get(member_key(sha, "pkg/helper")) == (True, None)
    # the member map is the links stage's too
    assert staged.get_doc("wheels", map_key(sha, target, frozenset())) is not None
    # a second layer of the same wheel finds them
    again = record_staged(root, [Wheel("pkg", "1.0", path, sha)], target, staged)
    assert again == Staged(recorded=0, known=2, left=1)


@pytest.mark.parametrize("change", ["byte", "size", "link", "gone", "left-out"])
def test_a_changed_file_is_not_recorded_as_the_member(tmp_path: Path, change: str) -> None:
    path = wheel(tmp_path)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    target = VenvTarget()
    root = tmp_path / "root"
    leaves = {"pkg": frozenset({f"{target.site_packages}/{SO}"})} if change == "left-out" else {}
    install([(ref(path), path)], target, root, remove=leaves)
    so = root / target.rel / target.site_packages / SO
    if change == "byte":  # the same size and another CRC
        data = bytearray(so.read_bytes())
        data[-1] ^= 1
        so.write_bytes(bytes(data))
    elif change == "size":
        so.write_bytes(so.read_bytes() + b"\0")
    elif change == "link":  # a symlink to the member's own bytes is not a regular file
        copy = tmp_path / "copy.so"
        shutil.copyfile(so, copy)
        so.unlink()
        so.symlink_to(copy)
    elif change == "gone":
        so.unlink()
    cache = Cache(tmp_path / "cache")
    got = record_staged(root, [Wheel("pkg", "1.0", path, sha)], target, cache, leaves)
    assert not cache.get(member_key(sha, SO))[0]
    assert got.recorded == 1  # the helper
    assert got.left == (1 if change == "left-out" else 2)  # the script, and the extension


def test_a_wheel_without_a_sha256_or_unreadable_is_skipped(tmp_path: Path) -> None:
    path = wheel(tmp_path)
    target = VenvTarget()
    root = tmp_path / "root"
    install([(ref(path), path)], target, root)
    cache = Cache(tmp_path / "cache")
    assert record_staged(root, [Wheel("pkg", "1.0", path)], target, cache) == Staged()
    bad = tmp_path / "bad.whl"
    bad.write_bytes(b"not a zip")
    assert record_staged(root, [Wheel("pkg", "1.0", bad, "0" * 64)], target, cache) == Staged()
    assert not (tmp_path / "cache").exists()
