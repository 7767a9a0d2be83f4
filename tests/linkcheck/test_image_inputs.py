"""The build side's readers: a wheel's members by their path in the image (a member that climbs
out is skipped), and a base's library folders from its layers (whiteouts, opaque folders, a
top-level symlink like /lib -> usr/lib, and hostile member names)."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envbuild.installed.venv import VenvTarget
from envbuild.linkcheck.reader import Cache
from envbuild.linkcheck.wheels import Wheel, base_system, wheel_entries


def layer(path: Path, members: list[tuple[str, str, str]]) -> tuple[Path, str]:
    """A plain tar layer of (name, kind f/l/d, link target)."""
    with tarfile.open(path, "w") as tf:
        for name, kind, link in members:
            info = tarfile.TarInfo(name)
            if kind == "d":
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
            elif kind == "l":
                info.type, info.linkname = tarfile.SYMTYPE, link
                tf.addfile(info)
            else:
                info.size = 1
                tf.addfile(info, io.BytesIO(b"x"))
    return path, "application/vnd.oci.image.layer.v1.tar"


def test_layers_whiteouts_and_a_lib_symlink(tmp_path: Path) -> None:
    low = layer(
        tmp_path / "1.tar",
        [
            ("lib", "l", "usr/lib"),
            ("usr/lib/x86_64-linux-gnu/libc.so.6", "f", ""),
            ("usr/lib/x86_64-linux-gnu/libold.so.1", "f", ""),
            ("usr/local/lib/libgone.so.2", "f", ""),
            ("etc/ld.so.conf.d/x.conf", "f", ""),
        ],
    )
    high = layer(
        tmp_path / "2.tar",
        [
            ("usr/lib/x86_64-linux-gnu/.wh.libold.so.1", "f", ""),
            ("usr/local/lib/.wh..wh..opq", "f", ""),
        ],
    )
    dirs, present = base_system([low, high])
    assert dirs[0] == "/lib/x86_64-linux-gnu"
    assert "/usr/lib/x86_64-linux-gnu/libc.so.6" in present
    assert "/lib/x86_64-linux-gnu/libc.so.6" in present  # through /lib -> usr/lib
    assert "/usr/lib/x86_64-linux-gnu/libold.so.1" not in present
    assert "/usr/local/lib/libgone.so.2" not in present


@settings(max_examples=30, deadline=None)
@given(
    names=st.lists(st.text(st.sampled_from("./abl.wh-so1"), min_size=1, max_size=30), max_size=8)
)
def test_hostile_member_names_give_a_listing(
    tmp_path_factory: pytest.TempPathFactory, names: list[str]
) -> None:
    tmp = tmp_path_factory.mktemp("layer")
    _, present = base_system([layer(tmp / "l.tar", [(n, "f", "") for n in names])])
    assert all(p.startswith("/") for p in present)


def test_a_wheel_member_that_climbs_out_is_skipped(tmp_path: Path) -> None:
    wheel = tmp_path / "evil-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("evil/_ok.so", b"\x7fELF not really")
        zf.writestr("evil-1.0.data/data/../../../../../../tmp/evil.so", b"\x7fELF")
        zf.writestr("evil-1.0.dist-info/RECORD", "evil/_ok.so,,\n")
    target = VenvTarget()
    entries, names, owners = wheel_entries(
        [Wheel("evil", "1.0", wheel)], target, tmp_path / "work", Cache(None)
    )
    assert list(entries) == ["/opt/venv/lib/python3.11/site-packages/evil/_ok.so"]
    assert not (tmp_path / "tmp").exists()
    assert all(p.startswith("/opt/venv/") for p in [*entries, *names, *owners])
