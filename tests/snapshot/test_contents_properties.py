"""The identity rule as a property: over random published file sets, hand edits on one side
and a patched wheel (with edits of its own) on the other, a distribution has no drift line
exactly when its files on disk are the same on both sides, whatever the RECORDs, versions'
envbuild marks and patches say. The two sides are snapshots' environments, their digests made
by the snapshot's own function (envbuild.snapshot.contents), compared by diff's."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from envbuild.fsio import record_digest
from envbuild.snapshot.contents import files_sha256
from envbuild.snapshot.diff.compare import compare
from envbuild.snapshot.diff.envfacts import env_facts
from envbuild.snapshot.diff.facts import Side
from envbuild.snapshot.model.pyenv import (
    AddedFile,
    Distribution,
    ModifiedFile,
    PatchedDist,
    PatchFile,
    PythonEnv,
)

PATHS = ["pkg/__init__.py", "pkg/a.py", "pkg/sub/b.py", "pkg/data.txt"]
NEW = ["pkg/new.py", "pkg/sub/debug_dump.py"]
BYTES = st.binary(max_size=6)
published = st.dictionaries(st.sampled_from(PATHS), BYTES, min_size=1)
edits = st.dictionaries(st.sampled_from(PATHS + NEW), st.none() | BYTES, max_size=3)


def _apply(files: dict[str, bytes], changes: dict[str, bytes | None]) -> dict[str, bytes]:
    out = dict(files)
    for path, data in changes.items():
        if data is None:
            out.pop(path, None)
        else:
            out[path] = data
    return out


def _sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _dist(version: str, record: dict[str, bytes], disk: dict[str, bytes]) -> Distribution:
    """A distribution installed from a wheel whose RECORD lists ``record``, its files now
    ``disk``: what the snapshot's file check finds, and its contents' digest."""
    info = f"pkg-{version}.dist-info"
    entries = [(p, record_digest(_sha(d))) for p, d in record.items()]
    entries += [(f"{info}/METADATA", record_digest(_sha(f"Version: {version}".encode())))]
    entries += [(f"{info}/RECORD", None)]
    modified = [
        ModifiedFile(path=p, reason="sha256", expected_size=len(record[p]),
                     actual_size=len(disk[p]), sha256=_sha(disk[p]).hex())
        for p in sorted(record) if p in disk and disk[p] != record[p]
    ]  # fmt: skip
    missing = sorted(set(record) - set(disk))
    unrecorded = sorted(set(disk) - set(record))
    text = "".join(f"{p},{d}\n" for p, d in entries)
    return Distribution(
        name="pkg", version=version, installer="uv", dist_info=info,
        record_sha256=hashlib.sha256(text.encode()).hexdigest(), files=len(entries),
        size_bytes=sum(len(d) for d in disk.values()), modified=modified, missing=missing,
        unrecorded=unrecorded,
        files_sha256=files_sha256(
            info, entries, {m.path: m.sha256 for m in modified}, set(missing),
            {p: _sha(disk[p]).hex() for p in unrecorded},
        ),
    )  # fmt: skip


def _side(label: str, dist: Distribution, disk: dict[str, bytes], patched: bool) -> Side:
    other = Distribution(
        name="other", version="2.0", installer="uv", dist_info="other-2.0.dist-info",
        record_sha256="0" * 64, files=1, size_bytes=1, files_sha256="1" * 64,
    )  # fmt: skip
    patches = (
        {"pkg": PatchedDist(version="1.0", patches=[PatchFile(path="p.patch", sha256="2" * 64)])}
        if patched
        else {}
    )
    env = PythonEnv(
        requested="/venv", executable="/venv/bin/python", prefix="/venv", version="3.11.9",
        implementation="cpython", site_packages=["/venv/lib/python3.11/site-packages"],
        integrity="full", distributions=[dist, other], patches=patches,
        added=[
            AddedFile(path=p, distribution="pkg", size=len(disk[p]), sha256=_sha(disk[p]).hex())
            for p in dist.unrecorded
        ],
    )  # fmt: skip
    side = Side(label, "snapshot")
    env_facts(side, "/venv", env)
    return side


@settings(max_examples=300, deadline=None)
@given(wheel=published, hand=edits, patch=edits, after=edits, marked=st.booleans())
def test_no_drift_line_exactly_when_the_files_are_the_same(
    wheel: dict[str, bytes],
    hand: dict[str, bytes | None],
    patch: dict[str, bytes | None],
    after: dict[str, bytes | None],
    marked: bool,
) -> None:
    # side a: the published wheel edited by hand; side b: the wheel patched (its RECORD lists
    # the patched files, its version marked as envbuild's when ``marked``), then edited too
    disk_a = _apply(wheel, hand)
    built = _apply(wheel, patch)
    disk_b = _apply(built, after)
    version_b = "1.0+envbuild.0123456789" if marked else "1.0"
    a = _side("hand", _dist("1.0", wheel, disk_a), disk_a, patched=False)
    b = _side("gen", _dist(version_b, built, disk_b), disk_b, patched=marked)
    result = compare(a, b)
    lines = [
        c
        for g in result.groups
        if g.counts
        for c in g.changes
        if c.subject.startswith("pkg") or (c.item or {}).get("distribution") == "pkg"
    ]
    assert not any("other" in c.subject for g in result.groups for c in g.changes)
    if disk_a == disk_b:
        assert lines == [], lines
        assert result.different is False
        assert len(result.info) <= 1
    else:
        assert lines, (disk_a, disk_b)
        # the package line names where it differs when the file lines do not
        packages = [c for g in result.groups if g.key == "packages /venv" for c in g.changes]
        every = set(disk_a) | set(disk_b) | set(wheel) | set(built)
        for pkg in [c for c in packages if c.subject == "pkg" and c.after]:
            if "other bytes in " in pkg.after:  # the same RECORD: exactly where they differ
                named = pkg.after.split("other bytes in ", 1)[1].rstrip(")").split(", ")
                assert set(named) == {p for p in every if disk_a.get(p) != disk_b.get(p)}
            elif "other files: " in pkg.after and " from a RECORD" in pkg.after:
                shown = pkg.after.split("other files: ", 1)[1].split(" differ", 1)[0]
                for path in shown.split(", "):  # each differs from its RECORD on a side
                    assert disk_a.get(path) != wheel.get(path) or disk_b.get(path) != built.get(
                        path
                    ), (path, pkg.after)
