"""The committed JSON schema of the snapshot manifest is the one the model generates."""

from __future__ import annotations

import json

from envbuild.fsio import canonical_json
from envbuild.snapshot.model.core import SCHEMA_FILE, schema


def test_committed_schema_is_current() -> None:
    assert SCHEMA_FILE.read_text() == canonical_json(schema()), (
        "regenerate: python -c "
        "'from envbuild.snapshot.model.core import write_schema; write_schema()'"
    )


def test_schema_pins_the_version_and_forbids_unknown_keys() -> None:
    data = json.loads(SCHEMA_FILE.read_text())
    assert data["properties"]["schema_version"]["const"] == 2
    assert data["additionalProperties"] is False
