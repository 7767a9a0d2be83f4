"""`envbuild diff S1 S2 S3 …` and `envbuild verify --fleet`: one table of what differs between
machines, with the pairwise diff's rule of "the same" (a row exactly where two machines differ
under :func:`compare`, whatever the order the files are given in), and clean errors for files
that are not snapshots."""

from __future__ import annotations

import json
from itertools import permutations
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envbuild.snapshot.diff.compare import compare, load_side, unmatched_envs
from envbuild.snapshot.diff.fleet import Row, fleet_files
from envbuild.snapshot.diff.render import render_fleet
from snapshot.test_json_properties import readable

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "h200-snapshot.json"
SNAPSHOT = json.loads(FIXTURE.read_text())


def machine(**edits: Any) -> dict[str, Any]:
    """The real snapshot with some facts changed: ``driver``, ``gpus`` (how many), ``version``
    (of the first distribution), ``edited`` (a drifted file of it, by its sha256), ``python``
    (the environment dropped), ``hostname`` (state: never a row), ``spec`` (a reference)."""
    snap = json.loads(json.dumps(SNAPSHOT))
    if "driver" in edits:
        snap["gpu"]["driver_version"] = edits["driver"]
    if "gpus" in edits:
        card = snap["gpu"]["gpus"][0]
        snap["gpu"]["gpus"] = [
            {**card, "index": i, "uuid": f"GPU-{i}"} for i in range(edits["gpus"])
        ]
    if "hostname" in edits:
        snap["host"]["hostname"] = edits["hostname"]
    dist = snap["pythons"][0]["distributions"][0]
    if "version" in edits:
        dist["version"] = edits["version"]
    if edits.get("edited"):
        dist["modified"] = [
            {"path": "absl/__init__.py", "reason": "sha256", "expected_size": 10,
             "actual_size": 10, "sha256": edits["edited"] * 64, "written_after_record": True}
        ]  # fmt: skip
    if edits.get("python") is False:
        snap["pythons"] = []
    return snap


def write(directory: Path, name: str, data: Any) -> Path:
    path = directory / f"{name}.json"
    path.write_text(json.dumps(data))
    return path


def test_identical_machines(cli: Any, tmp_path: Path) -> None:
    paths = [write(tmp_path, f"h{i}", machine(hostname=f"h{i}")) for i in range(3)]
    result = cli("diff", *paths)
    assert result.exit_code == 0, result.stderr
    assert "no difference across 3 machines" in result.stdout
    assert "h0" not in result.stdout.replace(str(tmp_path), "")  # the hostname is state
    assert cli("verify", "--fleet", *paths).stdout == result.stdout


def test_one_machine_differs(cli: Any, tmp_path: Path) -> None:
    a = write(tmp_path, "a", machine())
    b = write(tmp_path, "b", machine())
    c = write(tmp_path, "c", machine(driver="575.51.03", version="9.9", edited="e"))
    result = cli("diff", a, b, c)
    assert result.exit_code == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:4] == [
        "driver, CUDA and GPUs:",
        "  driver:",
        f"    580.159.04  on {a}, {b}",
        f"    575.51.03   on {c}",
    ]
    assert "  absl-py:" in lines
    assert f"    2.5.0  on {a}, {b}" in lines and f"    9.9    on {c}" in lines
    assert any(line.startswith("  absl/__init__.py") for line in lines), lines
    data = json.loads(cli("verify", "--fleet", a, b, c, "--json").stdout)
    assert data["machines"] == [str(a), str(b), str(c)] and data["different"] is True
    driver = next(r for r in data["rows"] if r["subject"] == "driver")
    assert driver == {
        "group": "gpu", "title": "driver, CUDA and GPUs", "subject": "driver",
        "values": ["580.159.04", "580.159.04", "575.51.03"],
    }  # fmt: skip


def test_the_common_value_of_a_big_fleet_is_counted(cli: Any, tmp_path: Path) -> None:
    paths = [write(tmp_path, f"h{i}", machine(driver="2" if i == 3 else "1")) for i in range(5)]
    assert cli("diff", *paths).stdout.splitlines()[:4] == [
        "driver, CUDA and GPUs:",
        "  driver:",
        f"    2  on {paths[3]}",
        "    1  on the other 4 machines",
    ]
    four = cli("diff", *paths[1:]).stdout.splitlines()  # three have 1: named
    assert four[2:4] == [f"    1  on {paths[1]}, {paths[2]}, {paths[4]}", f"    2  on {paths[3]}"]


def test_two_snapshots_keep_the_pairwise_diff(cli: Any, tmp_path: Path) -> None:
    a, c = write(tmp_path, "a", machine()), write(tmp_path, "c", machine(driver="1"))
    assert "  driver: 580.159.04 → 1" in cli("diff", a, c).stdout
    assert "    1           on" in cli("verify", "--fleet", a, c).stdout


@pytest.mark.parametrize("position", [0, 1, 2])
@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "no such file"),
        ("", "empty file"),
        ('{"kind": "envbuild.snapshot", "host"', "not valid JSON"),
        ('{"kind": "other"}', "unknown manifest kind"),
        ("[1, 2]", "expected a JSON object"),
        ('{"kind": "envbuild.snapshot", "schema_version": 2, "host": 1}', "bad.json"),
    ],
)
def test_a_bad_file_in_the_fleet(
    cli: Any, tmp_path: Path, position: int, content: str | None, needle: str
) -> None:
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    paths: list[Path] = [write(tmp_path, "a", machine()), write(tmp_path, "b", machine())]
    paths.insert(position, bad)
    for argv in (("diff", *paths), ("verify", "--fleet", *paths)):
        result = cli(*argv)
        assert result.exit_code == 2, (argv, result.stdout, result.stderr)
        assert str(bad) in result.stderr and needle in result.stderr, result.stderr
        assert "Traceback" not in result.stderr


def test_a_folder_in_the_fleet(cli: Any, tmp_path: Path) -> None:
    result = cli("verify", "--fleet", write(tmp_path, "a", machine()), tmp_path)
    assert result.exit_code == 2 and f"{tmp_path}: is a directory" in result.stderr


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("verify", "--fleet", "x.json"), "two snapshots or more"),
        (("verify", "m.json", "--fleet", "x.json", "y.json"), "give no MANIFEST"),
        (("verify", "--fleet", "x.json", "y.json", "--quick"), "give no MANIFEST"),
        (("verify",), "needs a MANIFEST"),
    ],
)
def test_fleet_usage(cli: Any, argv: tuple[str, ...], needle: str) -> None:
    result = cli(*argv)
    assert result.exit_code == 2 and needle in result.stderr, result.stderr


# --- the rule: rows exactly where two machines differ ------------------------------------------

EDITS = st.fixed_dictionaries(
    {},
    optional={
        "driver": st.sampled_from(["580.159.04", "575.51.03"]),
        "gpus": st.integers(min_value=0, max_value=2),
        "version": st.sampled_from(["2.5.0", "2.6.0"]),
        "edited": st.sampled_from(["", "a", "b"]),
        "python": st.just(False),
        "hostname": st.sampled_from(["x", "y"]),
    },
)


def pairwise_rows(paths: list[Path]) -> set[tuple[str, str]]:
    """Every (group, subject) a counted group of the pairwise diff names, over ordered pairs.
    Where compare pairs two environments at other paths it names their groups by the left
    side's path: here by the lesser of the two, whichever side it is."""
    rows = set()
    for a, b in permutations(paths, 2):
        side_a, side_b = load_side(a)[0], load_side(b)[0]
        only_a, only_b = unmatched_envs(side_a, side_b)
        named = only_a.pop() if len(only_a) == 1 == len(only_b) else None
        lesser = min(named, *only_b) if named else None
        for group in compare(side_a, side_b).groups:
            key = group.key
            if named and lesser and key.endswith(" " + named):
                key = key.removesuffix(named) + lesser
            if group.counts:
                rows |= {(key, c.subject) for c in group.changes}
    return rows


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(fleet=st.lists(EDITS, min_size=2, max_size=4), order=st.randoms(use_true_random=False))
def test_rows_are_where_two_machines_differ(
    tmp_path: Path, fleet: list[dict[str, Any]], order: Any
) -> None:
    paths = [write(tmp_path, f"m{i}", machine(**edits)) for i, edits in enumerate(fleet)]
    result = fleet_files(paths)
    rows = {(r.group, r.subject): r for r in result.rows}
    assert set(rows) == pairwise_rows(paths)
    assert result.different == bool(rows)
    render_fleet(result)
    json.dumps(result.as_dict())
    for row in result.rows:  # a row's values are not all one, unless one is unknown
        assert len(set(row.values)) > 1 or row.group == "refs", row
    shuffled = list(paths)
    order.shuffle(shuffled)
    again = fleet_files(shuffled)
    assert [(r.group, r.subject) for r in again.rows] == [(r.group, r.subject) for r in result.rows]
    for r, s in zip(result.rows, again.rows, strict=True):
        assert dict(zip(paths, r.values, strict=True)) == dict(zip(shuffled, s.values, strict=True))


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(docs=st.lists(readable, min_size=2, max_size=4), order=st.randoms(use_true_random=False))
def test_any_readable_documents_as_a_fleet(tmp_path: Path, docs: list[Any], order: Any) -> None:
    """Snapshots with environments at other paths, sections missing, build manifests among
    them: still a row exactly where a pair differs, and the same rows in any order."""
    paths = [write(tmp_path, f"m{i}", doc) for i, doc in enumerate(docs)]
    result = fleet_files(paths)
    assert {(r.group, r.subject) for r in result.rows} == pairwise_rows(paths)
    assert result.different == bool(result.rows)
    render_fleet(result)
    json.dumps(result.as_dict())
    shuffled = list(paths)
    order.shuffle(shuffled)
    assert fleet_files(shuffled).rows == [
        Row(r.group, r.title, r.subject, tuple(r.values[paths.index(p)] for p in shuffled))
        for r in result.rows
    ]
