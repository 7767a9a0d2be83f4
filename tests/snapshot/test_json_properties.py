"""The JSON readers of ``diff`` and ``verify`` are total: whatever a file holds, the answer is a
comparison (exit 0 or 1) or a clear user error (exit 2), never a traceback. Random JSON of any
shape, deep nesting, huge files, and documents diff can read (variants of a real snapshot,
generic and envbuild build manifests), compared in every pairing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envbuild.errors import ManifestError, UserError
from envbuild.snapshot.diff.compare import diff_files
from envbuild.snapshot.diff.render import render_text
from envbuild.snapshot.jsonfile import MAX_JSON_BYTES, MAX_JSON_DEPTH, read_json

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "h200-snapshot.json"
SNAPSHOT = json.loads(FIXTURE.read_text())

PROPS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Keys the readers look at, so random documents reach past the first check.
KEYS = [
    "kind", "schema_version", "host", "gpu", "pythons", "packages", "layers", "python", "lock",
    "python_version", "name", "version", "size", "digest", "diff_id", "generator", "format",
    "patches", "dist", "path", "sha256", "spec", "spec_hash", "lock_hash", "image", "id",
]  # fmt: skip
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(["envbuild.snapshot", "envbuild 0.1.0", "sha256:" + "a" * 64, "1.0"]),
)
keys = st.one_of(st.sampled_from(KEYS), st.text(max_size=6))
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=5)),
    max_leaves=25,
)


def write(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data))
    return path


def diff_or_user_error(a: Path, b: Path) -> int | None:
    """The diff's exit code (0 or 1), or None when a side is refused with a user error."""
    try:
        result = diff_files(a, b)
    except UserError as exc:
        assert exc.exit_code == 2
        assert str(a) in exc.message or str(b) in exc.message, exc.message
        return None
    render_text(result)
    json.dumps(result.as_dict())
    return 1 if result.different else 0


@PROPS
@given(data=json_values)
def test_any_json_against_a_snapshot(tmp_path: Path, data: Any) -> None:
    doc = write(tmp_path / "any.json", data)
    for a, b in ((FIXTURE, doc), (doc, FIXTURE), (doc, doc)):
        diff_or_user_error(a, b)


# --- documents diff can read -------------------------------------------------------------------

packages_map = st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=6), max_size=4)
packages_list = st.lists(
    st.fixed_dictionaries(
        {"name": st.text(min_size=1, max_size=8), "version": st.text(max_size=6)},
        optional={"size": st.integers(min_value=0, max_value=2**40)},
    ),
    max_size=4,
)
layer_items = st.lists(
    st.one_of(
        st.text(max_size=10),
        st.fixed_dictionaries(
            {"digest": st.text(max_size=10)},
            optional={
                "name": st.text(max_size=6),
                "size": st.integers(min_value=0, max_value=2**40),
                "diff_id": st.text(max_size=10),
            },
        ),
    ),
    min_size=1,
    max_size=4,
)
generic_manifests = st.fixed_dictionaries(
    {},
    optional={
        "packages": st.one_of(packages_map, packages_list),
        "python": st.fixed_dictionaries(
            {}, optional={"version": st.text(max_size=5), "packages": packages_map}
        ),
        "python_version": st.text(max_size=5),
        "layers": layer_items,
        "spec": st.text(max_size=5),
        "spec_hash": st.text(max_size=20),
        "lock_hash": st.text(max_size=20),
        "image": st.text(max_size=20),
    },
).filter(
    # readable: packages somewhere diff looks, or layers (a "python" with neither is not)
    lambda d: "packages" in d or "layers" in d or "packages" in d.get("python", {})
)

SECTIONS = ["pythons", "cuda_toolkits", "docker", "systemd", "hf_cache", "spec", "image"]


@st.composite
def snapshots(draw: st.DrawFn) -> dict[str, Any]:
    """The real snapshot with optional sections dropped, environments kept or not, and an
    image reference holding a generated build manifest."""
    snap = json.loads(json.dumps(SNAPSHOT))
    for key in draw(st.lists(st.sampled_from(SECTIONS), unique=True)):
        snap.pop(key, None)
    if "pythons" in snap:
        snap["pythons"] = draw(st.lists(st.sampled_from(snap["pythons"]), max_size=2))
        for env in snap["pythons"]:
            env["requested"] = draw(st.sampled_from(["/opt/venv", "/srv/a", "/srv/b"]))
        seen: set[str] = set()
        snap["pythons"] = [
            e for e in snap["pythons"] if not (e["requested"] in seen or seen.add(e["requested"]))
        ]
    if draw(st.booleans()):
        snap["image"] = {
            "path": "images/x",
            "manifest_file": "build-manifest.json",
            "manifest_sha256": "0" * 64,
            "manifest": draw(generic_manifests),
        }
    return snap


def envbuild_manifest(**changes: Any) -> dict[str, Any]:
    from envbuild.build.manifest import BuildManifest, BuiltLayer

    layer = BuiltLayer(
        name="python", kind="packages", key="k", digest="sha256:" + "a" * 64,
        diff_id="sha256:" + "b" * 64, size=2048, media_type="tar", distributions=["alpha==1.0"],
    )  # fmt: skip
    built = BuildManifest(
        generator="envbuild 0.1.0", spec="exp", spec_hash="c" * 64, lock_hash="d" * 64, base={},
        source_date_epoch=0, layers=[layer], config="sha256:" + "e" * 64,
        image="sha256:" + "1" * 64, outputs={},
    )  # fmt: skip
    return {**built.model_dump(mode="json"), **changes}


readable = st.one_of(
    snapshots(),
    generic_manifests,
    st.just(envbuild_manifest()),
    st.just(envbuild_manifest(layers=[])),
)


@PROPS
@given(a=readable, b=readable)
def test_two_readable_documents_always_compare(tmp_path: Path, a: Any, b: Any) -> None:
    """Any two documents diff reads compare: exit 0 or 1, never a user error, never a crash."""
    pa, pb = write(tmp_path / "a.json", a), write(tmp_path / "b.json", b)
    assert diff_or_user_error(pa, pb) in (0, 1)
    assert diff_or_user_error(pa, pa) == 0


def test_a_snapshot_without_pythons_against_a_build_manifest(tmp_path: Path, cli: Any) -> None:
    """Found by hand: KeyError 'python' (exit 4) when the manifest names no Python."""
    snap = {k: v for k, v in SNAPSHOT.items() if k != "pythons"}
    a = write(tmp_path / "snap.json", snap)
    b = write(tmp_path / "built.json", envbuild_manifest())
    result = cli("diff", a, b)
    assert result.exit_code == 1, result.stderr
    assert "1 distributions" in result.stdout


# --- bounds -----------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 100_000])
@pytest.mark.parametrize("kind", ["[", '{"a":'])
def test_deep_nesting_is_refused(tmp_path: Path, cli: Any, depth: int, kind: str) -> None:
    close = "]" if kind == "[" else "}"
    deep = tmp_path / "deep.json"
    deep.write_text(kind * depth + "1" + close * depth)
    for command in (("diff", FIXTURE, deep), ("diff", deep, FIXTURE), ("verify", deep)):
        result = cli(*command)
        assert result.exit_code == 2, result.stderr
        assert f"{deep}: nested deeper than {MAX_JSON_DEPTH} levels" in result.stderr
        assert "Traceback" not in result.stderr


def test_nesting_at_the_limit_is_read(tmp_path: Path) -> None:
    ok = tmp_path / "ok.json"
    ok.write_text("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH)
    assert read_json(ok) is not None


def test_a_huge_file_is_refused_unread(tmp_path: Path, cli: Any) -> None:
    huge = tmp_path / "huge.json"
    with huge.open("wb") as f:  # sparse: no disk used
        f.truncate(MAX_JSON_BYTES + 1)
    with pytest.raises(ManifestError, match="larger than 256 MiB"):
        read_json(huge)
    result = cli("diff", huge, FIXTURE)
    assert result.exit_code == 2 and "larger than" in result.stderr


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("1" * 5000, "not a manifest envbuild can read"),
        (b"\xff\xfe{}", "not UTF-8"),
        ("[" * 70_000, "nested deeper"),
    ],
)
def test_other_unreadable_json(tmp_path: Path, cli: Any, content: str | bytes, needle: str) -> None:
    bad = tmp_path / "bad.json"
    if isinstance(content, bytes):
        bad.write_bytes(content)
    else:
        bad.write_text(content)
    result = cli("diff", FIXTURE, bad)
    assert result.exit_code == 2 and needle in result.stderr, result.stderr
