"""Property tests of the spec reader for the values that reach a command line, the image or the
unit, and for its bounds: whatever goes there, ``envbuild validate`` (in-process) answers exit 0,
or exit 2 with every error located (a file, and a line for the value's key), never a traceback or
exit 4. Random values at those keys; random nesting; the seed spec's text with random TOML-ish
fragments spliced in."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envbuild.errors import ExitCode

FUZZ = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

SEED: dict[str, Any] = {
    "base": {"kind": "debian", "suite": "bookworm", "packages": ["python3"]},
    "python": {"version": "3.11", "platform": "manylinux_2_36_x86_64"},
    "vllm": {"version": "0.33.0"},
    "model": {"repo": "org/model", "revision": "a" * 40, "size_gb": 1},
    "serve": {"extra_args": [], "env": {}},
    "image": {"cmd": ["vllm", "serve"], "env": {}, "labels": {}},
    "builds": {"flash-attn": {"version": "2.8.3", "env": {"MAX_JOBS": "2"}}},
    "resolution": {"exclude_newer": "@CUTOFF@", "extra_index_urls": []},
}

HOSTILE = [
    "-", "--", "--setup-hook=touch /tmp/x", " ", "\t", "\0", "\n", "\r", "\x1b", ";", "$(id)",
    "`id`", "=", "|", ",", "#", "'", '"', "\\", "${X}", "$X", "%n", "..", "/", ":", "@", "[", "{",
    "http://", "file:///", "sk-" + "a" * 24, "hf_" + "b" * 30, "--api-key", "--hf-token=",
    "HF_TOKEN=", "sh -c '", "bookworm", "python3", "=1.0-1", "org/model", "ü",
]  # fmt: skip
text = st.lists(
    st.one_of(st.sampled_from(HOSTILE), st.text(max_size=6)), min_size=0, max_size=5
).map("".join)

#: where a random value goes: a key path (a str key of a table, or an index 0 of a list)
SLOTS: list[tuple[str | int, ...]] = [
    ("base", "suite"),
    ("base", "mirror"),
    ("base", "packages", 0),
    ("resolution", "index_url"),
    ("resolution", "extra_index_urls", 0),
    ("serve", "extra_args", 0),
    ("serve", "host"),
    ("serve", "served_model_name"),
    ("serve", "kv_cache_dtype"),
    ("model", "repo"),
    ("image", "cmd", 2),
    ("image", "workdir"),
    ("vllm", "extras", 0),
    ("description",),
]
#: tables whose keys are free: a random key and a random value
KEYED: list[tuple[str, ...]] = [
    ("image", "env"),
    ("image", "labels"),
    ("serve", "env"),
    ("builds", "flash-attn", "env"),
]


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _set(doc: dict[str, Any], path: tuple[str | int, ...], value: Any) -> None:
    at: Any = doc
    for i, part in enumerate(path[:-1]):
        at = at.setdefault(part, [] if isinstance(path[i + 1], int) else {})
    last = path[-1]
    if isinstance(last, int):
        while len(at) <= last:
            at.append("x")
        at[last] = value
    else:
        at[last] = value


def _write(repo: Path, doc: dict[str, Any]) -> Path:
    path = repo / "specs" / "f.toml"
    body = tomli_w.dumps(doc).replace('"@CUTOFF@"', "2025-01-15T00:00:00Z")
    path.write_text(body, "utf-8")
    return path


def _validated(cli: Any, path: Path) -> list[dict[str, Any]]:
    """The problems of ``validate --json``, after checking the exit code and that nothing
    escaped as a traceback."""
    result = cli("validate", "--json", path)
    assert result.exit_code in (ExitCode.OK, ExitCode.USER_ERROR), result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stdout
    problems: list[dict[str, Any]] = [
        p for r in json.loads(result.stdout).get("results", []) for p in r.get("problems", [])
    ]
    errors = [p for p in problems if p["severity"] == "error"]
    assert (result.exit_code == ExitCode.USER_ERROR) == bool(errors), result.stdout
    for p in errors:
        assert p["file"] == str(path), p  # as typed
    return errors


def _dotted(path: tuple[str | int, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


@FUZZ
@given(slot=st.sampled_from(SLOTS), value=text)
def test_a_random_value_where_it_reaches_an_argv(cli, repo, slot, value):
    doc = _copy(SEED)
    if slot[:2] == ("base", "mirror"):
        doc["base"]["mirror"] = value
    else:
        _set(doc, slot, value)
    errors = _validated(cli, _write(repo, doc))
    mine = [p for p in errors if p["key"].startswith(_dotted(slot))]
    for p in mine:
        assert p["line"] is not None, p  # at the value's own line
    if not mine:  # accepted: then it is what its command line can take
        assert not CONTROL.search(value.replace("\t", "").replace("\n", "")), value
        if slot not in FREE_TEXT:
            assert value and not value.startswith("-"), value
            assert not any(c.isspace() for c in value), value


#: slots that take free text (the rest reach an argv as a word of their own)
FREE_TEXT = {
    ("serve", "extra_args", 0),
    ("image", "cmd", 2),
    ("description",),
    ("image", "workdir"),
}
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@FUZZ
@given(table=st.sampled_from(KEYED), key=text.filter(bool), value=text)
def test_a_random_entry_in_an_env_or_labels_table(cli, repo, table, key, value):
    doc = _copy(SEED)
    _set(doc, (*table, key), value)
    errors = _validated(cli, _write(repo, doc))
    mine = [p for p in errors if p["key"].startswith(_dotted(table))]
    for p in mine:
        assert p["line"] is not None, p
    if not mine:  # accepted
        assert "\0" not in key and "\0" not in value
        if table[-1] == "env":
            assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key), key


@FUZZ
@given(
    depth=st.integers(min_value=0, max_value=1500),
    opener=st.sampled_from(["[", "{a = ", "[\n", "{ b = [", "[{c = "]),
)
def test_random_nesting(cli, repo, depth, opener):
    closer = {"[": "]", "{a = ": "}", "[\n": "\n]", "{ b = [": "]}", "[{c = ": "}]"}[opener]
    body = "x = " + opener * depth + "1" + closer * depth + "\n"
    path = repo / "specs" / "f.toml"
    path.write_text(_write(repo, _copy(SEED)).read_text("utf-8") + body, "utf-8")
    _validated(cli, path)


FRAGMENTS = [
    "[", "]", "{", "}", "[[", "]]", "=", '"', "'", '"""', "'''", "\n", "#", ".", ",", "\\",
    "extends = ", "[base]\n", "a.b.c = 1\n", "x = [", "\\u0000", "\0", "\r\n", "\ufeff",
]  # fmt: skip


@FUZZ
@given(
    cuts=st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=1),
            st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=6).map("".join),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_the_seed_with_toml_ish_fragments_spliced_in(cli, repo, cuts):
    path = _write(repo, _copy(SEED))
    body = path.read_text("utf-8")
    for where, fragment in cuts:
        at = int(where * len(body))
        body = body[:at] + fragment + body[at:]
    path.write_text(body, "utf-8")
    _validated(cli, path)
