"""`envbuild build` on a rootfs tarball and on an OCI layout whose members try to get past the
member rules (envbuild.build.base.tarsafe): names the layer writer cannot write as they were read
(a NUL in a PAX ``path`` or ``linkpath``: the rules checked the whole string, the layer carried
the part before the NUL), whiteouts that name no file. Each one was built; each is now exit 2
naming the file and what is wrong, through the real build path of both kinds of base."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import CliResult
from support.project import write_project

from envbuild.oci.compression import open_uncompressed
from envbuild.store.core import Store

from .base.tarcheck import oci_layout, pax_member, pax_tar

Build = Callable[..., CliResult]
DIR, SYM, LNK = tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE

#: Each was accepted, and the written layer held what the rules never saw.
NUL_ATTACKS = {
    # `etc/up -> ../..`: the rules saw `../..\0/x` (which stays inside)
    "climbs-out": [pax_member("etc", DIR), pax_member("etc/up", SYM, link="../..\0/x")],
    # two `etc/passwd`, the last a symlink to /proc/self/environ
    "two-passwd": [
        pax_member("etc", DIR),
        pax_member("etc/passwd", data=b"root:x:0:0::/root:/bin/sh\n"),
        pax_member("etc/passwd\0x", SYM, link="/proc/self/environ"),
    ],
    # a member named `etc/..`
    "dot-dot": [pax_member("etc", DIR), pax_member("etc/..\0x", data=b"x")],
    # a file a hardlink names, replaced afterwards
    "hardlinked-replaced": [
        pax_member("f", data=b"shared"),
        pax_member("h", LNK, link="f"),
        pax_member("f\0x", SYM, link="/etc/shadow"),
    ],
}

BAD_WHITEOUTS = {
    "top-dot": [pax_member(".wh..")],
    "top-dot-dot": [pax_member(".wh...")],
    "folder-dot": [pax_member("etc", DIR), pax_member("etc/.wh..")],
    "folder-dot-dot": [pax_member("etc", DIR), pax_member("etc/.wh...")],
    "empty": [pax_member("etc/.wh.")],
    "below-a-whiteout": [pax_member("a/.wh../x", data=b"x")],
    "aufs-metadata": [pax_member(".wh..wh.plnk")],
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One store for the module: the venv layer is built once."""
    return tmp_path_factory.mktemp("hostile") / "store"


def build_base_of(repo: Path, cli: Build, store: Path, kind: str, raw: bytes) -> CliResult:
    """`envbuild build` of a spec whose base is ``raw`` (a tar): as a rootfs tarball, or as the
    one layer of an OCI layout."""
    if kind == "rootfs":
        base = repo / "evil.tar"
        base.write_bytes(raw)
    else:
        base = oci_layout(repo / "layout", [raw])
    spec = write_project(repo, "hostile", [], base=base)
    return cli("build", "--store", store, "--output", repo / "out", spec)


def refused(result: CliResult, repo: Path, needle: str) -> None:
    assert result.exit_code == 2, result.stderr
    assert needle in result.stderr, result.stderr
    assert str(repo / ("evil.tar" if "rootfs" in result.stderr else "layout")) in result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    assert not (repo / "out").exists()


@pytest.mark.parametrize("kind", ["rootfs", "oci-layout"])
@pytest.mark.parametrize("case", sorted(NUL_ATTACKS))
def test_a_nul_in_a_pax_name_is_refused(
    repo: Path, cli: Build, store: Path, kind: str, case: str
) -> None:
    result = build_base_of(repo, cli, store, kind, pax_tar(NUL_ATTACKS[case]))
    refused(result, repo, "holds a NUL byte (a name ends there)")


@pytest.mark.parametrize("kind", ["rootfs", "oci-layout"])
@pytest.mark.parametrize("case", sorted(BAD_WHITEOUTS))
def test_a_whiteout_naming_no_file_is_refused(
    repo: Path, cli: Build, store: Path, kind: str, case: str
) -> None:
    """``.wh..`` and ``.wh...`` were kept: an engine joining them to their folder removes the
    folder itself, or its parent (the whole root at the top)."""
    result = build_base_of(repo, cli, store, kind, pax_tar(BAD_WHITEOUTS[case]))
    needle = {"below-a-whiteout": "lies below a whiteout", "aufs-metadata": "AUFS metadata"}
    refused(result, repo, needle.get(case, "names no file"))


def test_an_opaque_whiteout_in_an_upper_layer_is_kept(repo: Path, cli: Build, store: Path) -> None:
    lower = pax_tar([pax_member("etc", DIR), pax_member("etc/old", data=b"old")])
    upper = pax_tar([pax_member("etc/.wh..wh..opq"), pax_member("etc/new", data=b"new")])
    spec = write_project(repo, "opaque", [], base=oci_layout(repo / "layout", [lower, upper]))
    result = cli("build", "--store", store, "--output", repo / "out", spec)
    assert result.exit_code == 0, result.stderr


def test_names_that_are_not_utf8_are_written_as_read(repo: Path, cli: Build, store: Path) -> None:
    """A name's bytes reach the layer unchanged, whatever the locale: tarfile reads bytes that
    are not UTF-8 as surrogates, the writer turns them back."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        info = tarfile.TarInfo("etc/caf\udce9")  # b"etc/caf\xe9": Latin-1, not UTF-8
        info.size = 2
        tf.addfile(info, io.BytesIO(b"ok"))
        link = tarfile.TarInfo("etc/link")
        link.type, link.linkname = SYM, "caf\udce9"
        tf.addfile(link)
    (repo / "latin1.tar").write_bytes(buf.getvalue())
    spec = write_project(repo, "latin1", [], base=repo / "latin1.tar")
    result = cli("build", "--store", store, "--output", repo / "out", "--json", spec)
    assert result.exit_code == 0, result.stderr
    base = next(x for x in result.json()["layers"] if x["kind"] == "base")
    with open_uncompressed(Store(store).blob_path(base["digest"]), base["media_type"]) as f:
        raw = f.read()
    names = {}
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:", encoding="latin-1") as tf:
        for m in tf:
            names[m.name.encode("latin-1")] = m.linkname.encode("latin-1")
    assert names[b"etc/caf\xe9"] == b""
    assert names[b"etc/link"] == b"caf\xe9"


def _rootfs_with(modes: dict[str, int]) -> bytes:
    """A rootfs tarball as a distribution ships one: bin/su 4755, a setgid folder (not a file:
    not recorded) and the files of ``modes``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for name, mode in [("bin", 0o755), ("usr", 0o755), ("usr/bin", 0o755), ("var", 0o755),
                           ("var/mail", 0o2775)]:  # fmt: skip
            info = tarfile.TarInfo(name)
            info.type, info.mode = DIR, mode
            tf.addfile(info)
        for name, mode in modes.items():
            info = tarfile.TarInfo(name)
            info.mode, info.size = mode, 4
            tf.addfile(info, io.BytesIO(b"\x7fELF"))
    return buf.getvalue()


def test_setuid_and_setgid_files_are_kept_and_shown(
    repo: Path, cli: Build, store: Path, tmp_path: Path
) -> None:
    """bin/su 4755 was kept silently: it is kept (a base needs it), recorded in the build
    manifest, shown by `build` (text and --json) and compared by `envbuild diff`."""
    modes = {"bin/su": 0o4755, "usr/bin/wall": 0o2755, "usr/bin/ls": 0o755}
    (repo / "root.tar").write_bytes(_rootfs_with(modes))
    spec = write_project(repo, "setid", [], base=repo / "root.tar")
    text = cli("build", "--store", store, "--output", repo / "out", spec)
    assert text.exit_code == 0, text.stderr
    assert "base keeps 2 setuid/setgid file(s): bin/su 4755, usr/bin/wall 2755" in text.stderr
    shown = cli("build", "--store", store, "--output", repo / "out", "--json", spec).json()
    assert shown["base"]["setid"] == {"bin/su": "4755", "usr/bin/wall": "2755"}
    manifest = repo / "out" / "build-manifest.json"
    assert '"setid":{"bin/su":"4755","usr/bin/wall":"2755"}' in manifest.read_text().replace(
        " ", ""
    ).replace("\n", "")
    base = next(x for x in shown["layers"] if x["kind"] == "base")
    with (
        open_uncompressed(Store(store).blob_path(base["digest"]), base["media_type"]) as f,
        tarfile.open(fileobj=io.BytesIO(f.read()), mode="r:") as layer,
    ):
        kept = {m.name: m.mode for m in layer}
    assert (kept["bin/su"], kept["usr/bin/wall"]) == (0o4755, 0o2755)

    before = tmp_path / "before.json"
    before.write_bytes(manifest.read_bytes())
    modes["usr/bin/ls"] = 0o4755
    (repo / "root.tar").write_bytes(_rootfs_with(modes))
    spec = write_project(repo, "setid", [], base=repo / "root.tar")
    assert cli("build", "--store", store, "--output", repo / "out", spec).exit_code == 0
    diff = cli("diff", before, manifest)
    assert diff.exit_code == 1, diff.stderr
    assert "setuid/setgid files (base)" in diff.stdout
    assert "usr/bin/ls: ∅ → 4755" in diff.stdout, diff.stdout
    data = cli("diff", before, manifest, "--json").json()
    [group] = [g for g in data["groups"] if g["key"] == "setid"]
    assert [c["subject"] for c in group["changes"]] == ["usr/bin/ls"]


def test_a_setuid_file_whose_name_is_not_utf8_is_recorded_escaped(
    repo: Path, cli: Build, store: Path
) -> None:
    """A member named with bytes that are not UTF-8 (b'bin/su\\xe9') and mode 4755: the build
    ends (was: UnicodeEncodeError, exit 4, writing the manifest; found by the OCI layout fuzz)
    and the manifest names it as text, its odd byte as \\xe9."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT,
                      encoding="utf-8", errors="surrogateescape") as tf:  # fmt: skip
        info = tarfile.TarInfo("bin")
        info.type, info.mode = DIR, 0o755
        tf.addfile(info)
        info = tarfile.TarInfo(b"bin/su\xe9".decode("utf-8", "surrogateescape"))
        info.mode, info.size = 0o4755, 4
        tf.addfile(info, io.BytesIO(b"\x7fELF"))
    (repo / "root.tar").write_bytes(buf.getvalue())
    spec = write_project(repo, "oddname", [], base=repo / "root.tar")
    done = cli("build", "--store", store, "--output", repo / "out", "--json", spec)
    assert done.exit_code == 0, done.stderr
    assert done.json()["base"]["setid"] == {"bin/su\\xe9": "4755"}
    manifest = json.loads((repo / "out" / "build-manifest.json").read_text(encoding="utf-8"))
    assert manifest["base"]["setid"] == {"bin/su\\xe9": "4755"}
