"""Bounds of the spec reader: tables and arrays nested more than MAX_DEPTH (64) deep, and
``extends`` chains longer than MAX_EXTENDS (32) files or naming more than MAX_FILES (256) in all,
are refused by ``envbuild validate`` with exit 2 at their file and line, never a RecursionError
(exit 4) or a walk through exponentially many files. Real files, through the CLI."""

from __future__ import annotations

import pytest

from envbuild.errors import ExitCode
from envbuild.spec.load import MAX_DEPTH, MAX_EXTENDS, MAX_FILES

TAIL = (
    '[base]\nkind = "debian"\n[python]\nversion = "3.11"\n'
    "[resolution]\nexclude_newer = 2025-01-15T00:00:00Z\n"
)

DEEP = {
    "inline arrays": "x = " + "[" * 1000 + "]" * 1000 + "\n",
    "inline tables": "x = " + "{a = " * 1000 + "1" + "}" * 1000 + "\n",
    "multi-line arrays": "x = [\n" + "[\n" * 1000 + "]\n" * 1000 + "]\n",
    "a table header": "[" + ".".join(["a"] * 1000) + "]\nx = 1\n",
    "a dotted key": ".".join(["a"] * 1000) + " = 1\n",
    "arrays of tables": "".join(f"[[{'.'.join(['a'] * (i + 1))}]]\n" for i in range(100)),
}


@pytest.mark.parametrize("body", DEEP.values(), ids=list(DEEP))
def test_too_deep_is_refused_located(cli, repo, body):
    spec = repo / "specs" / "deep.toml"
    spec.write_text('name = "deep"\n' + body, "utf-8")
    result = cli("validate", spec)
    assert result.exit_code == ExitCode.USER_ERROR, result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    line = next(ln for ln in result.stderr.splitlines() if "nest more than 64 deep" in ln)
    assert line.startswith(f"{spec}:"), line  # the spec as typed
    assert line.split(":")[1].isdigit(), line  # a line number


def test_brackets_in_strings_and_comments_do_not_count(cli, repo):
    spec = repo / "specs" / "fine.toml"
    many = "[" * 200
    spec.write_text(
        f'description = "{many}"  # {many}\n'
        f"[image]\nlabels = {{ a = '{many}', b = \"\"\"\n{many}\n\"\"\", c = '''{many}''' }}\n"
        + TAIL,
        "utf-8",
    )
    result = cli("validate", spec)
    assert result.exit_code == ExitCode.OK, result.stderr


def test_at_the_depth_limit_is_not_too_deep(cli, repo):
    spec = repo / "specs" / "limit.toml"
    spec.write_text("x = " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "\n" + TAIL, "utf-8")
    result = cli("validate", spec)
    assert "nest more than" not in result.stderr
    assert "x: error: unknown key" in result.stderr  # read, and judged as any other key


def _chain(repo, length: int) -> None:
    specs = repo / "specs"
    for i in range(length):
        head = f'extends = "c{i + 1}.toml"\n' if i < length - 1 else ""
        (specs / f"c{i}.toml").write_text(head + f'description = "c{i}"\n' + TAIL, "utf-8")


def test_a_long_extends_chain_is_refused_located(cli, repo):
    _chain(repo, 1000)
    result = cli("validate", repo / "specs" / "c0.toml")
    assert result.exit_code == ExitCode.USER_ERROR, result.stderr
    assert "internal error" not in result.stderr
    last = MAX_EXTENDS - 1
    # the file is not under the current folder: named by its absolute path
    where = f"{repo}/specs/c{last}.toml:1: extends: error:"
    assert f"{where} extends chains more than {MAX_EXTENDS} files deep" in result.stderr


def test_an_extends_chain_at_the_limit_is_read(cli, repo):
    _chain(repo, MAX_EXTENDS)
    result = cli("validate", repo / "specs" / "c0.toml")
    assert result.exit_code == ExitCode.OK, result.stderr


def test_extends_that_fan_out_are_bounded(cli, repo):
    """Each file extends the next level twice: 2^14 loads unbounded; refused after MAX_FILES."""
    specs = repo / "specs"
    levels = 14
    for i in range(levels):
        nxt = f'extends = ["l{i + 1}a.toml", "l{i + 1}b.toml"]\n' if i < levels - 1 else TAIL
        for side in "ab":
            (specs / f"l{i}{side}.toml").write_text(nxt, "utf-8")
    result = cli("validate", specs / "l0a.toml")
    assert result.exit_code == ExitCode.USER_ERROR, result.stderr
    assert f"extends names more than {MAX_FILES} files in all" in result.stderr
