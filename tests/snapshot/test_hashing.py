"""The parallel hasher: forked workers and threads give the same answers as hashlib."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from envbuild.snapshot import hashing


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, int]:
    """Files of every kind hash_files meets, with the size RECORD would give (0 if unknown)."""
    items: dict[str, int] = {}
    for i in range(700):  # several batches of small files
        path = tmp_path / "small" / f"f{i:03d}.py"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"x = %d\n" % i * (i % 7))
        items[str(path)] = path.stat().st_size
    for i, size in enumerate((hashing.BIG, 3 * hashing.BIG + 17)):  # mapped, not read
        big = tmp_path / f"big{i}.so"
        big.write_bytes(os.urandom(size))
        items[str(big)] = size
    (tmp_path / "empty").touch()
    items[str(tmp_path / "empty")] = 0
    os.mkfifo(tmp_path / "fifo")
    items[str(tmp_path / "fifo")] = 10
    (tmp_path / "dir").mkdir()
    items[str(tmp_path / "dir")] = 0
    items[str(tmp_path / "gone")] = 5
    return items


def check(results: dict[str, hashing.FileHash], items: dict[str, int], root: Path) -> None:
    assert set(results) == set(items)
    for path, fh in results.items():
        assert fh.path == path
        if path.endswith(("fifo", "dir")):
            assert (fh.digest, fh.error, fh.missing) == (None, "not a regular file", False)
        elif path.endswith("gone"):
            assert fh.digest is None and fh.missing and fh.error
        else:
            data = Path(path).read_bytes()
            expected = (hashlib.sha256(data).digest(), len(data), None)
            assert (fh.digest, fh.size, fh.error) == expected
            assert fh.mtime_ns == os.stat(path).st_mtime_ns


@pytest.mark.parametrize("engine", ["processes", "threads"])
def test_both_engines_agree_with_hashlib(
    tree: dict[str, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    monkeypatch.setattr(hashing, "ENGINE", engine)
    assert hashing._use_processes(3, 0) is (engine == "processes")  # forked here, really
    calls: list[int] = []
    results = hashing.hash_files(tree.items(), workers=3, meanwhile=lambda: calls.append(1))
    assert calls == [1]
    check(results, tree, tmp_path)


def test_a_failing_worker_is_an_error_not_a_short_answer(
    tree: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(batch: list[str], buffer: bytearray | None = None) -> list[hashing.FileHash]:
        raise RuntimeError("worker broke")

    monkeypatch.setattr(hashing, "ENGINE", "processes")
    monkeypatch.setattr(hashing, "_hash_batch", broken)
    with pytest.raises(OSError, match="hashing worker"):
        hashing.hash_files(tree.items(), workers=2)


def test_largest_files_go_first_and_small_ones_in_batches(tree: dict[str, int]) -> None:
    batches = hashing._batches(list(tree.items()))
    sizes = [sum(tree[p] for p in b) for b in batches]
    assert [len(b) for b in batches[:2]] == [1, 1]
    assert sizes[0] == 3 * hashing.BIG + 17
    assert sorted(p for b in batches for p in b) == sorted(tree)
    assert all(len(b) <= hashing.BATCH_FILES for b in batches)
