"""Reading a manifest's JSON from a file that may be anything: a total function that either returns
the decoded value or raises :class:`~envbuild.errors.ManifestError` saying why the file cannot be
read, never half-reading a huge or absurdly nested one."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from envbuild.errors import ManifestError

log = logging.getLogger(__name__)


#: The largest manifest read (a snapshot of a big machine is a few MB) and the deepest nesting
#: of its arrays and objects (envbuild writes at most 8 levels; a build manifest of another tool
#: may nest deeper, not this deep). Beyond either the file is refused, never half-read.
MAX_JSON_BYTES = 256 << 20
MAX_JSON_DEPTH = 64


def read_json(path: Path) -> Any:
    """Decode a JSON file, turning every way it can be unreadable into a :class:`ManifestError`:
    missing, not a file, not UTF-8, not JSON, larger than :data:`MAX_JSON_BYTES` or nested
    deeper than :data:`MAX_JSON_DEPTH`."""
    try:
        with Path(path).open("rb") as f:
            raw = f.read(MAX_JSON_BYTES + 1)
    except FileNotFoundError as exc:
        raise ManifestError(f"{path}: no such file") from exc
    except IsADirectoryError as exc:
        raise ManifestError(f"{path}: is a directory, not a manifest") from exc
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read: {exc}") from exc
    if len(raw) > MAX_JSON_BYTES:
        raise ManifestError(
            f"{path}: larger than {MAX_JSON_BYTES >> 20} MiB, more than any manifest envbuild "
            "writes; refusing to read it"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{path}: cannot read: not UTF-8 ({exc.reason})") from exc
    if not text.strip():
        raise ManifestError(f"{path}: empty file")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ManifestError(
            f"{path}:{exc.lineno}: not valid JSON ({exc.msg}, column {exc.colno})",
            hint="the file may be truncated; take the snapshot again",
        ) from exc
    except RecursionError:
        data = _TOO_DEEP
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise ManifestError(f"{path}: not a manifest envbuild can read ({exc})") from exc
    if data is _TOO_DEEP or not _shallow(data, MAX_JSON_DEPTH):
        raise ManifestError(
            f"{path}: nested deeper than {MAX_JSON_DEPTH} levels, deeper than any manifest; "
            "refusing to read it"
        )
    return data


_TOO_DEEP = object()


def _shallow(data: Any, limit: int) -> bool:
    """Whether ``data`` nests at most ``limit`` arrays and objects deep (without recursion)."""
    stack = [(data, 1)] if isinstance(data, dict | list) else []
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value
        if depth > limit:
            return False
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return True
