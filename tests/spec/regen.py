"""Refresh the golden files of the spec cases: ``python -m tests.spec.regen [NAME...]``.

Review the diff before committing it: a changed expected.json is a changed behaviour.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from tests.spec.cases import CASES, case_names, regenerate


def main(argv: list[str]) -> int:
    names = argv or case_names()
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            data = regenerate(name, Path(tmp))
        text = json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        target = CASES / name / "expected.json"
        if not target.exists() or target.read_text("utf-8") != text:
            target.write_text(text, "utf-8")
            print(f"updated {target.relative_to(CASES.parent.parent.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
