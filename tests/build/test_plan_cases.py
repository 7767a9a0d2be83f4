"""The build plan of each case under ``tests/cases/build/`` is its ``plan.json`` (see
``tests/support/plan_cases.py``; refresh with ``python tests/build/regen.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.plan_cases import CASES, SHARED, case_names, compute, load_expected, plan_text


@pytest.mark.parametrize("name", case_names())
def test_the_plan_is_the_golden_one(name: str, tmp_path: Path) -> None:
    got = compute(name, tmp_path)
    want = load_expected(name)
    assert got == want, f"the plan of {name} changed: run `python tests/build/regen.py {name}`"


def test_the_golden_files_are_as_regen_writes_them() -> None:
    for name in case_names():
        text = (CASES / name / "plan.json").read_text("utf-8")
        assert text == plan_text(load_expected(name)), name


def test_the_seed_cases_are_the_seeds() -> None:
    """A seed spec's case holds the seed and its lock as they are in specs/ and lockfiles/."""
    repo = CASES.parent.parent.parent
    seeds = sorted(p.stem for p in (repo / "specs").glob("*.toml"))
    assert seeds and set(seeds) <= set(case_names())
    for name in seeds:
        case = CASES / name
        assert (case / "spec.toml").read_bytes() == (repo / "specs" / f"{name}.toml").read_bytes()
        lock = f"pylock.{name}.toml"
        assert (case / lock).read_bytes() == (repo / "lockfiles" / lock).read_bytes(), name
        for held in case.glob("patches/*"):
            assert held.read_bytes() == (repo / "specs" / "patches" / held.name).read_bytes()
    for base in (repo / "specs" / "base").glob("*.toml"):
        assert (SHARED / "base" / base.name).read_bytes() == base.read_bytes()
