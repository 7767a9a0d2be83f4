"""The parallel hasher: forked workers and threads give the same answers as hashlib."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from envbuild.installed import hashing

REPO = Path(__file__).resolve().parents[2]


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


def check(
    results: dict[str, hashing.FileHash], items: dict[str, int], root: Path, *, hashed: bool = True
) -> None:
    assert set(results) == set(items)
    for path, fh in results.items():
        assert fh.path == path
        if path.endswith(("fifo", "dir")):
            assert (fh.digest, fh.error, fh.missing) == (None, "not a regular file", False)
        elif path.endswith("gone"):
            assert fh.digest is None and fh.missing and fh.error
        else:
            data = Path(path).read_bytes()
            expected = (hashlib.sha256(data).digest() if hashed else None, len(data), None)
            assert (fh.digest, fh.size, fh.error) == expected
            assert fh.mtime_ns == os.stat(path).st_mtime_ns


# Forked workers are used only by a process running no other thread (fork would be unsafe), and
# a test session runs some (the fixtures' local HTTP servers): the process engine is tested in a
# fresh interpreter, where it really forks.
_IN_A_FRESH_PROCESS = """
import json, sys
from envbuild.installed import hashing
hashing.ENGINE = "processes"
assert hashing.use_processes(3, 0), "the process engine would not fork here"
items = json.load(sys.stdin)
if sys.argv[1] == "broken":
    def broken(batch, buffer=None):
        raise RuntimeError("worker broke")
    hashing._hash_batch = broken
    try:
        hashing.hash_files(items.items(), workers=2)
    except OSError as exc:
        print(json.dumps({"error": str(exc)}))
    sys.exit(0)
calls = []
results = hashing.hash_files(
    items.items(), workers=3, meanwhile=lambda: calls.append(1), stat_only=sys.argv[1] == "stat"
)
out = {p: [fh.size, fh.digest.hex() if fh.digest else None, fh.error, fh.missing, fh.mtime_ns]
       for p, fh in results.items()}
print(json.dumps({"calls": calls, "results": out}))
"""


def in_fresh_process(mode: str, items: dict[str, int]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _IN_A_FRESH_PROCESS, mode],
        input=json.dumps(items),
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    return out


@pytest.mark.parametrize("look", ["hash", "stat"])
def test_the_process_engine_agrees_with_hashlib(
    tree: dict[str, int], tmp_path: Path, look: str
) -> None:
    """Forked workers give hashlib's digests ("hash"), or for the quick check's look ("stat")
    the sizes and mtimes alone, with the same errors either way."""
    got = in_fresh_process(look, tree)
    assert got["calls"] == [1]
    results = {
        path: hashing.FileHash(path, size, bytes.fromhex(hex_) if hex_ else None, err, gone, mt)
        for path, (size, hex_, err, gone, mt) in got["results"].items()
    }
    check(results, tree, tmp_path, hashed=look == "hash")


def test_stat_only_forks_for_many_files_not_many_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hashing.threading, "active_count", lambda: 1)  # the threshold, not fork
    many = hashing.PROCESS_MIN_FILES
    assert hashing.ENGINE == "auto"
    assert hashing.use_processes(2, 0, many, stat_only=True)
    assert hashing.use_processes(2, hashing.PROCESS_MIN_BYTES, 0)
    assert not hashing.use_processes(2, 1 << 40, many - 1, stat_only=True)
    assert not hashing.use_processes(2, hashing.PROCESS_MIN_BYTES - 1, many)


def test_the_thread_engine_agrees_with_hashlib(
    tree: dict[str, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hashing, "ENGINE", "threads")
    assert not hashing.use_processes(3, 1 << 40)
    calls: list[int] = []
    results = hashing.hash_files(tree.items(), workers=3, meanwhile=lambda: calls.append(1))
    assert calls == [1]
    check(results, tree, tmp_path)


def test_a_process_running_threads_never_forks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hashing, "ENGINE", "processes")
    started, stop = threading.Event(), threading.Event()
    other = threading.Thread(target=lambda: (started.set(), stop.wait()), daemon=True)
    other.start()
    try:
        started.wait()
        assert not hashing.use_processes(3, 1 << 40)
    finally:
        stop.set()
        other.join()


def test_a_failing_worker_is_an_error_not_a_short_answer(tree: dict[str, int]) -> None:
    got = in_fresh_process("broken", tree)
    assert "hashing worker" in got.get("error", ""), got


def test_largest_files_go_first_and_small_ones_in_batches(tree: dict[str, int]) -> None:
    batches = hashing._batches(list(tree.items()))
    sizes = [sum(tree[p] for p in b) for b in batches]
    assert [len(b) for b in batches[:2]] == [1, 1]
    assert sizes[0] == 3 * hashing.BIG + 17
    assert sorted(p for b in batches for p in b) == sorted(tree)
    assert all(len(b) <= hashing.BATCH_FILES for b in batches)
