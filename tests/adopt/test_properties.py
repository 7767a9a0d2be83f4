"""Generated RECORDs, file trees and edits: the RECORD comparison is exact modulo what
installers write, a patch adopt writes applies (by envbuild's own patch step) to exactly the
edited bytes, and adopt never writes outside its outputs nor loses an edit."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import shutil
import zipfile

import pytest
from adopt.conftest import make_venv, served, site_packages, tree_digest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.wheels import make_wheel

from envbuild.adopt import Options, adopt, diffs, wheelrecord
from envbuild.sourcebuild.patches import PatchRef, apply_patch, patch_wheel
from envbuild.store.core import Store

NAME = st.text("abcdefghij_", min_size=1, max_size=6)
PATH = st.lists(NAME, min_size=1, max_size=3).map(lambda parts: "/".join(parts) + ".py")
# text with the separators str.splitlines would cut at, and lines without a final newline
TEXT = st.text(st.sampled_from("ab \t\n\r\x0c\x1cé€"), max_size=60)


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _record(rows: list[list[str]]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


@st.composite
def trees(draw: st.DrawFn, *, min_size: int = 1) -> dict[str, bytes]:
    paths = draw(st.lists(PATH, min_size=min_size, max_size=6, unique=True))
    paths = [p for p in paths if not any(q != p and q.startswith(p[:-3] + "/") for q in paths)]
    return {f"pkg/{p}": draw(TEXT).encode() for p in paths}


@settings(max_examples=60, deadline=None)
@given(files=trees(), extra=st.lists(NAME, max_size=3), change=st.data())
def test_record_comparison_is_exact_modulo_installer_files(
    tmp_path_factory: pytest.TempPathFactory,
    files: dict[str, bytes],
    extra: list[str],
    change: st.DataObject,
) -> None:
    wheel = make_wheel(tmp_path_factory.mktemp("w"), "pkg", "1.0", files)
    with zipfile.ZipFile(wheel) as zf:
        shipped = zf.read("pkg-1.0.dist-info/RECORD").decode()
    rows = [r for r in csv.reader(io.StringIO(shipped)) if r]
    # what an installer adds: its own files, scripts outside site-packages, bytecode
    rows += [["pkg-1.0.dist-info/INSTALLER", _digest(b"uv\n"), "3"]]
    rows += [[f"../../../bin/{n}", _digest(n.encode()), str(len(n))] for n in extra]
    rows += [[f"pkg/__pycache__/{n}.cpython-311.pyc", "", ""] for n in extra]
    assert wheelrecord.compare(wheel, _record(rows)).same
    # any one line changed is named, and only it
    listed = [i for i, r in enumerate(rows) if r[0] in files]
    i = change.draw(st.sampled_from(listed))
    rows[i] = [rows[i][0], _digest(b"other bytes"), rows[i][2]]
    got = wheelrecord.compare(wheel, _record(rows))
    assert not got.same and got.differ == [rows[i][0]]


@settings(max_examples=40, deadline=None)
@given(files=trees(), data=st.data())
def test_a_patch_gives_exactly_the_edited_bytes(
    tmp_path_factory: pytest.TempPathFactory, files: dict[str, bytes], data: st.DataObject
) -> None:
    edits = []
    for path, before in files.items():
        kind = data.draw(st.sampled_from(["keep", "edit", "delete"]))
        if kind == "edit":
            edits.append(diffs.Edit(path, before, data.draw(TEXT).encode()))
        elif kind == "delete" and before:
            edits.append(diffs.Edit(path, before, None))
    tree = tmp_path_factory.mktemp("tree")
    for path, before in files.items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_bytes(before)
    text = diffs.patch_text(edits)
    changed = [e for e in edits if e.after != e.before]
    if not changed:
        assert text == ""
        return
    patch = tree.parent / f"{tree.name}.patch"
    patch.write_text(text, encoding="utf-8")
    touched = apply_patch(tree, patch, patch.name)
    assert sorted(touched) == sorted(e.path for e in changed)
    for path, before in files.items():
        edit = next((e for e in changed if e.path == path), None)
        if edit is None:
            assert (tree / path).read_bytes() == before
        elif edit.after is None:
            assert not (tree / path).exists()
        else:
            assert (tree / path).read_bytes() == edit.after


def test_binary_bytes_are_refused_not_patched() -> None:
    with pytest.raises(diffs.NotText):
        diffs.file_diff(diffs.Edit("a.bin", b"\0\1", b"\0\2"))
    with pytest.raises(diffs.NotText):
        diffs.file_diff(diffs.Edit("a.txt", b"ok\n", b"\xff\xfe"))


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(files=trees(min_size=2), data=st.data())
def test_adopt_writes_only_its_outputs_and_loses_no_edit(
    tmp_path_factory: pytest.TempPathFactory, files: dict[str, bytes], data: st.DataObject
) -> None:
    work = tmp_path_factory.mktemp("adopt")
    wheel = make_wheel(work / "w", "pkg", "1.0", {**files, "pkg/blob.bin": b"\0\1\2"})
    venv = make_venv(work / "venv", "pkg", find_links=work / "w")
    site = site_packages(venv)
    edited: dict[str, bytes | None] = {}
    for path in sorted(files):
        kind = data.draw(st.sampled_from(["keep", "edit", "delete"]), label=path)
        if kind == "edit":
            new = data.draw(TEXT).encode() + b"# edited\n"
            (site / path).write_bytes(new)
            edited[path] = new
        elif kind == "delete":
            (site / path).unlink()
            edited[path] = None
    if data.draw(st.booleans(), label="binary edit"):
        (site / "pkg" / "blob.bin").write_bytes(b"\0\1\3")
    added = data.draw(st.lists(NAME, max_size=2, unique=True), label="unrecorded")
    for n in added:
        (site / "pkg" / f"{n}.added").write_text("by hand\n")
    repo = work / "repo"
    (repo / ".git").mkdir(parents=True)
    before = tree_digest(venv)

    with served([wheel], work / "ix") as url:
        got = adopt(Options(str(venv), repo, name="x", index_url=url, store=Store(work / "st")))

    assert tree_digest(venv) == before
    written = set(tree_digest(repo))
    assert written <= {"specs/x.toml", "lockfiles/pylock.x.toml", "patches/x/pkg.patch"}
    assert {"specs/x.toml", "lockfiles/pylock.x.toml"} <= written
    # every file that differs from its RECORD is in the patch or named as not adopted
    in_patch = {f for p in got.patches for f in p.files}
    new = {f for p in got.patches for f in p.new}
    named = {n.path for n in got.not_adopted}
    differing = {p for p, new in edited.items() if new != files[p]}
    if (site / "pkg" / "blob.bin").read_bytes() != b"\0\1\2":
        differing.add("pkg/blob.bin")
    assert differing == (in_patch - new) | named and not in_patch & named
    # and every file no RECORD lists is a new file of the patch
    assert {f"pkg/{n}.added" for n in added} == new and got.unrecorded == []
    # and the patch, applied by envbuild's own patch step, gives the edited files
    if in_patch:
        patch = repo / "patches" / "x" / "pkg.patch"
        ref = PatchRef(
            path="patches/x/pkg.patch", sha256=hashlib.sha256(patch.read_bytes()).hexdigest()
        )
        out = work / "patched"
        made = patch_wheel(wheel, [(patch, ref)], "0123456789", out)
        with zipfile.ZipFile(out / made.wheel) as zf:
            names = set(zf.namelist())
            for path in in_patch:
                if path in new:
                    assert zf.read(path) == b"by hand\n"
                elif edited[path] is None:
                    assert path not in names
                else:
                    assert zf.read(path) == edited[path]
    shutil.rmtree(work)
