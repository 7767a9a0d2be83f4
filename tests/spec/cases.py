"""The data-driven spec cases under ``tests/cases/spec/<name>/``.

A case folder holds ``spec.toml`` (the spec under test), optionally ``fixed.toml`` (the same
spec with the problem fixed) and any other file the specs name, plus ``expected.json``: for each
entry, the CLI's exit code and every problem ``envbuild validate`` must report (file, line, key,
severity and a substring of the message). ``_shared/`` is copied to ``specs/base/`` of every
case, so a case can ``extends = "base/host.toml"``.

Each case runs in a fresh repository: ``<tmp>/.git`` and the case's files under ``<tmp>/specs/``,
validated from the repository's root as ``specs/<entry>``: the files in expected.json are named
as a user who typed that sees them (the spec as typed, the files it extends relative to the
current folder; tests/spec/test_shown_paths.py covers the other ways of naming it).
Refresh the golden files with ``python -m tests.spec.regen`` (see docs/spec.md).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from typing import Any

from envbuild.errors import ExitCode, Problem, Severity, SpecError
from envbuild.spec.validate import validate

CASES = Path(__file__).resolve().parent.parent / "cases" / "spec"
SHARED = CASES / "_shared"
ENTRIES = ("spec.toml", "fixed.toml")


def case_names() -> list[str]:
    return sorted(p.name for p in CASES.iterdir() if p.is_dir() and not p.name.startswith("_"))


def materialize(name: str, into: Path) -> Path:
    """Lay case ``name`` out as a repository under ``into``; return its ``specs/`` folder."""
    (into / ".git").mkdir(parents=True, exist_ok=True)
    specs = into / "specs"
    shutil.copytree(CASES / name, specs, ignore=shutil.ignore_patterns("expected.json"))
    shutil.copytree(SHARED, specs / "base", dirs_exist_ok=True)
    return specs


def entries(name: str) -> list[str]:
    return [e for e in ENTRIES if (CASES / name / e).exists()]


def problems_of(spec: Path, *, cwd: Path | None = None) -> tuple[int, list[Problem]]:
    """What validating ``spec`` gives: the exit code the CLI must return, and every problem.
    It is validated as a user would name it from ``cwd`` (by default the case's repository, so
    ``specs/spec.toml``, and the files it extends ``specs/base/…``: what the golden files say)."""
    cwd = cwd or spec.parent.parent
    with contextlib.chdir(cwd):
        try:
            report = validate(spec.relative_to(cwd))
        except SpecError as exc:
            return ExitCode.USER_ERROR, exc.problems
    return ExitCode.OK, report.warnings


def as_expected(problem: Problem) -> dict[str, Any]:
    return {
        "file": problem.file,
        "line": problem.line,
        "key": problem.key,
        "severity": problem.severity.value,
        "message": problem.message,
    }


def matches(expected: dict[str, Any], problem: Problem) -> bool:
    return (
        expected["file"] == problem.file
        and expected["line"] == problem.line
        and expected["key"] == problem.key
        and Severity(expected["severity"]) is problem.severity
        and expected["message"] in problem.message
    )


def load_expected(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CASES / name / "expected.json").read_text("utf-8"))
    return data


def regenerate(name: str, workdir: Path) -> dict[str, Any]:
    """Fresh golden data for case ``name``. A message substring already in expected.json is
    kept when it still matches; otherwise the whole new message is written."""
    old: dict[str, Any] = {}
    path = CASES / name / "expected.json"
    if path.exists():
        old = json.loads(path.read_text("utf-8"))
    specs = materialize(name, workdir)
    out: dict[str, Any] = {}
    for entry in entries(name):
        code, problems = problems_of(specs / entry)
        previous = list(old.get(entry, {}).get("problems", []))
        rows = []
        for problem in problems:
            row = as_expected(problem)
            for prev in previous:
                if matches(prev, problem):
                    row["message"] = prev["message"]
                    previous.remove(prev)
                    break
            rows.append(row)
        out[entry] = {"exit_code": code, "problems": rows}
    return out
