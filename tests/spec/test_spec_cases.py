"""Every case under tests/cases/spec/ gives exactly the problems its expected.json lists, through
the core and through the CLI (exit code, one line per problem, no traceback)."""

from __future__ import annotations

import pytest

from envbuild.errors import ExitCode, Severity, SpecError
from envbuild.spec.check import check_stack
from envbuild.spec.load import load_spec
from spec.cases import (
    as_expected,
    case_names,
    entries,
    load_expected,
    matches,
    materialize,
    problems_of,
)


@pytest.fixture(params=case_names())
def case(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_case_problems(case, tmp_path):
    expected = load_expected(case)
    assert sorted(expected) == sorted(entries(case)), "expected.json must cover each entry"
    specs = materialize(case, tmp_path)
    for entry in entries(case):
        want = expected[entry]
        code, problems = problems_of(specs / entry)
        got = [as_expected(p) for p in problems]
        assert code == want["exit_code"], f"{entry}: {got}"
        unmatched = list(problems)
        for row in want["problems"]:
            hit = next((p for p in unmatched if matches(row, p)), None)
            assert hit is not None, f"{entry}: {row} not among {got}"
            unmatched.remove(hit)
        assert not unmatched, f"{entry}: unexpected {[as_expected(p) for p in unmatched]}"
        if entry == "fixed.toml":
            assert code == ExitCode.OK, "the fixed spec must validate"


def test_case_stack_problems_say_how_to_fix(case, tmp_path):
    specs = materialize(case, tmp_path)
    for entry in entries(case):
        try:
            loaded = load_spec(specs / entry)
        except SpecError:
            continue
        for problem in check_stack(loaded):
            assert problem.hint, problem.render()
            assert problem.key, problem.render()
            assert problem.line is not None, problem.render()


def test_case_through_cli(case, tmp_path, cli, monkeypatch):
    specs = materialize(case, tmp_path)
    monkeypatch.chdir(tmp_path)
    for entry in entries(case):
        code, problems = problems_of(specs / entry)
        result = cli("validate", f"specs/{entry}")
        assert result.exit_code == code
        assert "Traceback" not in result.stderr + result.stdout
        lines = [p.render() for p in problems]
        if code == ExitCode.USER_ERROR:
            # One line per problem, errors and warnings alike, nothing else.
            assert result.stderr.splitlines() == lines
        else:
            assert result.stdout.splitlines()[:-1] == lines
            n = len(lines)
            ending = ": ok" if not n else (" (1 warning)" if n == 1 else f" ({n} warnings)")
            assert result.stdout.splitlines()[-1].endswith(ending)

        as_json = cli("validate", "--json", f"specs/{entry}")
        assert as_json.exit_code == code
        (only,) = as_json.json()["results"]
        assert only["ok"] is (code == ExitCode.OK)
        assert only["problems"] == [p.as_dict() for p in problems]


def test_errors_and_warnings_are_kept_apart(tmp_path):
    specs = materialize("all-at-once", tmp_path)
    _, problems = problems_of(specs / "spec.toml")
    severities = {p.severity for p in problems}
    assert severities == {Severity.ERROR, Severity.WARNING}
    err = SpecError(problems)
    assert "(and 4 more)" in err.message  # the summary counts errors only
