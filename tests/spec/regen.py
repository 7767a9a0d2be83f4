"""Refresh the spec's golden files: ``python -m tests.spec.regen [NAME...]``.

Rewrites ``tests/cases/spec/<NAME>/expected.json`` (all cases when no NAME is given) and
``schema/spec.schema.json``. Review the diff before committing it: a changed golden file is a
changed behaviour.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from envbuild.spec.model import Spec

from .cases import CASES, case_names, regenerate

REPO = CASES.parent.parent.parent
SCHEMA = REPO / "schema" / "spec.schema.json"


def schema_text() -> str:
    """The committed JSON schema of a spec, as it must read (canonical, trailing newline)."""
    return json.dumps(Spec.model_json_schema(), indent=2, sort_keys=True) + "\n"


def _write(target: Path, text: str) -> None:
    if not target.exists() or target.read_text("utf-8") != text:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, "utf-8")
        print(f"updated {target.relative_to(REPO)}")


def main(argv: list[str]) -> int:
    names = argv or case_names()
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            data = regenerate(name, Path(tmp))
        text = json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        _write(CASES / name / "expected.json", text)
    _write(SCHEMA, schema_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
