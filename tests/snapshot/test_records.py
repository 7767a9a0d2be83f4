"""The RECORD check's jobs: every line checked exactly once, big files alone and first, and
forked workers judging alike to threads."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from envbuild.fsio import record_digest
from envbuild.installed import hashing
from envbuild.snapshot import records
from envbuild.snapshot.distinfo import find_dists
from envbuild.snapshot.pyenv import Interpreter, scan_site_packages

REPO = Path(__file__).resolve().parents[2]


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def install(
    site: Path, name: str, files: dict[str, bytes], extra: Sequence[str] = (), end: str = "\n"
) -> None:
    """A distribution as an installer leaves it: its files, METADATA and a RECORD written by
    the csv module (quotes where a path needs them, ``end`` after each line)."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator=end)
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
        writer.writerow([rel, f"sha256={b64(data)}", len(data)])
    out.write("".join(line + end for line in extra))
    writer.writerows([[f"{name}-1.0.dist-info/{n}", "", ""] for n in ("METADATA", "RECORD")])
    (info / "RECORD").write_bytes(out.getvalue().encode())


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """Two distributions sharing a path (``late`` installed last), big files in both, many
    small ones, a quoted RECORD, and the edits a debugging session leaves."""
    site = tmp_path / "site-packages"
    big = os.urandom(hashing.BIG + 5)
    small = {f"early/m{i:03d}.py": b"x = %d\n" % i for i in range(300)}
    install(
        site, "early",
        {**small, "early/lib.so": big, "early/huge.so": big * 3, "common/x.py": b"early\n"},
        extra=[
            "early/odd.py,sha256=AAAA,12345678,extra",  # four fields: not a big file's line
            "early/__pycache__/m.cpython-311.pyc,,",
            "early/uni.py,sha256=AAAA,١٢٣٤٥٦٧٨",  # digits, but not ASCII ones
        ],
    )  # fmt: skip
    install(site, "late", {"late/a.so": big[::-1], "common/x.py": b"late\n"})
    install(
        site, "comma",
        {"comma/a,b.py": b"q = 1\n", "comma/big.so": big, "comma/c,d.so": big,
         "comma/two\nlines.so": big, 'comma/"q".py': b""},
    )  # fmt: skip
    install(site, "crlf", {"crlf/a.so": big, "crlf/b.py": b"b\n"}, end="\r\n")
    install(site, "crlfq", {"crlfq/a,b.so": big, "crlfq/c.py": b"c\n"}, end="\r\n")
    (site / "early" / "m007.py").write_text("x = 7\nprint('DEBUG')\n")
    (site / "early" / "huge.so").write_bytes(big * 2 + os.urandom(hashing.BIG + 5))  # same size
    (site / "early" / "m008.py").unlink()
    (site / "late" / "a.so").write_bytes(b"truncated")
    (site / "early" / "hack.py").write_text("")
    (site / "early" / "odd.py").write_text("odd = 1\n")
    (site / "early" / "uni.py").write_text("uni = 1\n")
    return site


@pytest.mark.parametrize("chunk", [1, 1000])  # 1: a cut after every line it may cut at
def test_every_line_is_in_exactly_one_job(
    site: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    monkeypatch.setattr(records, "CHUNK_CHARS", chunk)
    dists = find_dists("test", [str(site)])
    jobs = records.plan(dists)
    got: Counter[tuple[int, str]] = Counter()
    for job in jobs:
        checked = records.check_job(job, dists, "quick")
        paths = checked.paths.split("\0") if checked.paths else []
        assert (checked.dist, checked.files) == (job.dist, len(paths))
        got.update((job.dist, path) for path in paths)
    assert got == Counter((n, e.abs) for n, d in enumerate(dists) for e in d.entries())
    chunks = [j for j in jobs if isinstance(j, records.Chunk)]
    per_dist = Counter(dists[j.dist].name for j in chunks)
    assert per_dist["early"] > 1 and per_dist["crlfq"] == 1
    bigs = [j for j in jobs if isinstance(j, records.Big)]
    # big files are jobs of their own, but for one on two lines and those of a quoted RECORD
    # with carriage returns, which stays whole
    assert sorted(os.path.relpath(j.entry.abs, site) for j in bigs) == [
        "comma/big.so", "comma/c,d.so", "crlf/a.so", "early/huge.so", "early/lib.so", "late/a.so",
    ]  # fmt: skip
    assert jobs[0] == max(bigs, key=lambda j: j.cost)  # the biggest file first
    assert [j.cost for j in jobs] == sorted((j.cost for j in jobs), reverse=True)


def scan(site: Path) -> dict[str, object]:
    interp = Interpreter("py", "py", str(site.parent), "3.11.0", "cpython", [str(site)])
    return scan_site_packages(interp, "full").model_dump(mode="json")


def test_the_findings(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records, "CHUNK_CHARS", 1000)
    env = scan(site)
    by_name = {d["name"]: d for d in env["distributions"]}  # type: ignore[attr-defined]
    early, late = by_name["early"], by_name["late"]
    assert [(m["path"], m["reason"]) for m in early["modified"]] == [
        ("early/huge.so", "sha256"),  # same size, other bytes: a big file's own job found it
        ("early/m007.py", "size"),
        ("early/odd.py", "size"),
        ("early/uni.py", "sha256"),
    ]
    assert early["missing"] == ["early/m008.py"]
    assert early["unrecorded"] == ["early/hack.py"]
    assert [(m["path"], m["reason"]) for m in late["modified"]] == [("late/a.so", "size")]
    for clean in ("comma", "crlf", "crlfq"):
        assert by_name[clean]["modified"] == by_name[clean]["missing"] == [], clean
    assert by_name["comma"]["files"] == 5 + 2
    # common/x.py holds late's bytes: early, installed first, is not told it was modified
    assert env["overlaps"] == [
        {"path": "common/x.py", "owners": ["early", "late"], "matches": ["late"]}
    ]
    assert early["files"] == 300 + 2 + 1 + 2 + 2  # small, big, shared, odd+uni, metadata
    listed = [*(site / "early").iterdir(), site / "common" / "x.py"]
    listed += (site / "early-1.0.dist-info").iterdir()
    assert early["size_bytes"] == sum(p.stat().st_size for p in listed if p.name != "hack.py")


_FORKED = """
import json, os, sys
from envbuild.fsio import record_digest
from envbuild.installed import hashing
from envbuild.snapshot import records
from envbuild.snapshot.pyenv import Interpreter, scan_site_packages
hashing.ENGINE, hashing.DEFAULT_WORKERS, records.CHUNK_CHARS = "processes", 3, 1000
forks, fork = [], os.fork
os.fork = lambda: forks.append(1) or fork()
site = sys.argv[1]
interp = Interpreter("py", "py", os.path.dirname(site), "3.11.0", "cpython", [site])
env = scan_site_packages(interp, "full").model_dump(mode="json")
print(json.dumps({"forks": len(forks), "env": env}))
"""


def test_forked_workers_find_what_threads_find(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records, "CHUNK_CHARS", 1000)
    in_threads = scan(site)
    done = subprocess.run(
        [sys.executable, "-c", _FORKED, str(site)],
        capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    forked = json.loads(done.stdout)
    assert forked["forks"] == 3
    assert forked["env"] == in_threads


@pytest.mark.parametrize("data", [b"", b"a", b"\xfb\xff\xbf" * 11, os.urandom(1000)])
def test_record_digest_is_urlsafe_base64_without_padding(data: bytes) -> None:
    """The one encoder of a RECORD hash (the build, the patcher and the check use it)."""
    digest = hashlib.sha256(data).digest()
    assert record_digest(digest) == base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    assert record_digest(b"\xfb\xff\xbf") == "-_-_"  # the urlsafe letters, not + and /
