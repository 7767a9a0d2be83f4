"""Refresh the golden build plans: ``python tests/build/regen.py [NAME...]``.

Copies the seed specs (``specs/<name>.toml``, ``specs/base/``, the patches their cases hold) and
their locks (``lockfiles/``) into their cases, then rewrites ``tests/cases/build/<NAME>/plan.json``
(all cases when no NAME is given). Review the diff before committing it: a changed plan is a
changed layer key, so every image built from that spec gets other layers.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/, as pytest has it

from support.plan_cases import CASES, case_names, compute, plan_text


def main(argv: list[str]) -> int:
    for name in argv or case_names():
        with tempfile.TemporaryDirectory() as tmp:
            text = plan_text(compute(name, Path(tmp)))
        target = CASES / name / "plan.json"
        if not target.exists() or target.read_text("utf-8") != text:
            target.write_text(text, "utf-8")
            print(f"updated {target.relative_to(CASES.parent.parent.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
