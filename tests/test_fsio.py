"""fsio's atomic writes (the file is synced before its rename and its folder after it, so a
file written through atomic_writer, a "done" marker or a manifest, survives a crash) and its
rmtree (read-only folders, a file, a link, nothing)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.fsevents import record_syncs

from envbuild import fsio


def test_atomic_writer_syncs_the_folder_after_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "out" / "done"
    target.parent.mkdir()
    events = record_syncs(monkeypatch)
    with fsio.atomic_writer(target) as f:
        f.write(b"ok\n")
    assert target.read_bytes() == b"ok\n"
    assert [kind for kind, _ in events] == ["fsync", "replace", "fsync"]
    assert events[0][1].startswith(str(target.parent / ".done."))  # the temporary file
    assert events[1:] == [("replace", str(target)), ("fsync", str(target.parent))]


def test_a_failed_write_leaves_the_old_file_and_syncs_nothing_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "done"
    target.write_bytes(b"old\n")
    events = record_syncs(monkeypatch)
    with pytest.raises(RuntimeError), fsio.atomic_writer(target) as f:
        f.write(b"half")
        raise RuntimeError("interrupted")
    assert target.read_bytes() == b"old\n"
    assert events == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done"]


def test_fsync_dir_refuses_a_folder_that_is_not_there(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        fsio.fsync_dir(tmp_path / "missing")


def test_rmtree_removes_a_tree_with_read_only_folders_a_file_or_nothing(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "ro" / "deep").mkdir(parents=True)
    (tree / "ro" / "deep" / "f").write_text("x")
    (tree / "ro" / "deep").chmod(0o500)
    (tree / "ro").chmod(0o500)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "kept", target_is_directory=True)
    (tmp_path / "kept").mkdir()
    single = tmp_path / "file"
    single.write_text("y")
    for path in (tree, link, single, tmp_path / "missing"):
        fsio.rmtree(path)
        assert not os.path.lexists(path)
    assert (tmp_path / "kept").is_dir()  # a link is removed, not what it points at


def test_json_of_a_name_that_is_not_utf8_is_escaped_and_reads_back() -> None:
    """A setuid file or a member name read with surrogateescape can reach a manifest: the
    document is written (escaped), reads back to the same value, and other documents keep
    their UTF-8 bytes as they were (their digests do not move)."""
    import json

    from envbuild.fsio import canonical_json, compact_json

    odd = {"setid": {"usr/bin/\udce9": "4755"}, "author": "Zoë"}
    for text in (canonical_json(odd), compact_json(odd).decode()):
        assert json.loads(text) == odd
        text.encode()
    assert compact_json({"author": "Zoë"}) == '{"author":"Zoë"}'.encode()
