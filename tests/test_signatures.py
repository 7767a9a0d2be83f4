"""No function takes more than 8 parameters (ruff's PLR0913, ``max-args = 8``), but for the few
below, each marked ``# noqa: PLR0913``. The list may only shrink: a function that comes to take
fewer leaves it (this test says so), and a new one over the limit is refused here as by ruff."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAX_ARGS = 8

#: ``path:function`` -> its parameters (``self`` and ``cls`` not counted, as ruff counts)
ALLOWED = {
    "envbuild/adopt/specfile.py:spec_data": 12,  # the spec's every field, by keyword
    "envbuild/proc/core.py:run": 11,  # the one subprocess function: each option a keyword
    "envbuild/apply/assemble.py:_tree": 10,
    "tests/support/project.py:write_project": 10,
    "tests/apply/conftest.py:write": 9,
}


def parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = fn.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names)


def over_the_limit(root: Path, folders: tuple[str, ...] = ("envbuild", "tests")) -> dict[str, int]:
    """Every function under ``folders`` of ``root`` with more than :data:`MAX_ARGS` parameters."""
    found = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text("utf-8"))):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                if (count := parameters(node)) > MAX_ARGS:
                    found[f"{path.relative_to(root).as_posix()}:{node.name}"] = count
    return found


def test_no_function_over_eight_parameters_but_the_listed() -> None:
    found = over_the_limit(REPO)
    new = {name: n for name, n in found.items() if name not in ALLOWED}
    assert not new, f"more than {MAX_ARGS} parameters (pass one value instead): {new}"
    grown = {name: n for name, n in found.items() if n > ALLOWED[name]}
    assert not grown, f"the listed functions may only lose parameters: {grown}"


def test_the_list_only_shrinks() -> None:
    """A function that left the list (fewer parameters, renamed, gone) is taken off it."""
    found = over_the_limit(REPO)
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"no longer over {MAX_ARGS} parameters: take them off ALLOWED: {stale}"
    fewer = {name: found[name] for name in ALLOWED if name in found and found[name] < ALLOWED[name]}
    assert not fewer, f"these take fewer parameters now: lower their counts in ALLOWED: {fewer}"


def test_the_count_finds_a_function_over_the_limit(tmp_path: Path) -> None:
    (tmp_path / "envbuild").mkdir()
    (tmp_path / "envbuild" / "x.py").write_text(
        "class C:\n    def m(self, a, b, c, d, e, f, g, h): ...\n"
        "def nine(a, b, c, d, e, f, g, *, h, i): ...\n"
    )
    assert over_the_limit(tmp_path, ("envbuild",)) == {"envbuild/x.py:nine": 9}
