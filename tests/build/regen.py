"""Refresh the golden build plans: ``python tests/build/regen.py [NAME...]``.

Copies the seed specs (``specs/<name>.toml``, ``specs/base/``, the patches their cases hold) and
their locks (``lockfiles/``) into their cases, then rewrites ``tests/cases/build/<NAME>/plan.json``
(all cases when no NAME is given). Review the diff before committing it: a changed plan is a
changed layer key, so every image built from that spec gets other layers.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/, as pytest has it

from support.plan_cases import CASES, SHARED, case_names, compute, plan_text

REPO = CASES.parent.parent.parent


def _copy(src: Path, dest: Path) -> None:
    if not dest.exists() or dest.read_bytes() != src.read_bytes():
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
        print(f"updated {dest.relative_to(REPO)}")


def refresh_seeds() -> None:
    """The seed cases hold the seeds as specs/ and lockfiles/ have them now."""
    for base in sorted((REPO / "specs" / "base").glob("*.toml")):
        _copy(base, SHARED / "base" / base.name)
    for spec in sorted((REPO / "specs").glob("*.toml")):
        case = CASES / spec.stem
        _copy(spec, case / "spec.toml")
        lock = f"pylock.{spec.stem}.toml"
        _copy(REPO / "lockfiles" / lock, case / lock)
        for held in sorted(case.glob("patches/*")):
            _copy(REPO / "specs" / "patches" / held.name, held)


def main(argv: list[str]) -> int:
    refresh_seeds()
    for name in argv or case_names():
        with tempfile.TemporaryDirectory() as tmp:
            text = plan_text(compute(name, Path(tmp)))
        target = CASES / name / "plan.json"
        if not target.exists() or target.read_text("utf-8") != text:
            target.write_text(text, "utf-8")
            print(f"updated {target.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
