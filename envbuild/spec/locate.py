"""Where each key of a TOML document is: a key path → its 1-based line (and a key path written
dotted, as problems name it).

``tomllib`` gives values, not positions, and a problem must name the line of its key. This is a
line scanner for the TOML that people write in specs: ``[table]`` and ``[[array]]`` headers,
``key = value`` and dotted ``a.b = value`` keys, with multi-line strings and arrays skipped.
Keys inside an inline table, or array items, map to the line of the key that holds them; a lookup
for a path with no line of its own falls back to its nearest located parent.
"""

from __future__ import annotations

import re

_BARE = r"[A-Za-z0-9_-]+"
_QUOTED = r'"(?:[^"\\]|\\.)*"|\'[^\']*\''
_KEY = rf"(?:{_BARE}|{_QUOTED})"
_DOTTED = rf"{_KEY}(?:\s*\.\s*{_KEY})*"
_HEADER = re.compile(rf"^\s*(\[\[?)\s*({_DOTTED})\s*\]\]?\s*(?:#.*)?$")
_ASSIGN = re.compile(rf"^\s*({_DOTTED})\s*=\s*(.*)$")
_PART = re.compile(_KEY)

#: Where a value is in a spec: its keys from the top, with the index of each array item.
KeyPath = tuple[str | int, ...]


def dotted(key: KeyPath) -> str:
    """A key path as a spec writes it: ``("serve", "extra_args", 2)`` -> ``serve.extra_args[2]``."""
    out = ""
    for part in key:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _split(dotted: str) -> list[str]:
    parts = []
    for m in _PART.finditer(dotted):
        token = m.group(0)
        if token[0] in "\"'":
            token = token[1:-1]
        parts.append(token)
    return parts


def _opens_multiline(value: str) -> str | None:
    """If ``value`` starts a multi-line string that does not close on this line, its delimiter."""
    for delim in ('"""', "'''"):
        if value.startswith(delim) and value.count(delim) == 1:
            return delim
    return None


def _bracket_depth(value: str) -> int:
    """Net ``[``/``{`` depth of a value, ignoring brackets inside strings and comments."""
    depth = 0
    quote: str | None = None
    escaped = False
    for ch in value:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\" and quote == '"':
                escaped = True
            elif ch == quote:
                quote = None
            continue
        if ch in "\"'":
            quote = ch
        elif ch == "#":
            break
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
    return depth


def locate_keys(text: str) -> dict[KeyPath, int]:
    lines: dict[KeyPath, int] = {}
    table: KeyPath = ()
    array_counts: dict[KeyPath, int] = {}
    in_string: str | None = None
    depth = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        if in_string:
            if in_string in raw:
                in_string = None
            continue
        if depth > 0:
            depth += _bracket_depth(raw)
            continue
        header = _HEADER.match(raw)
        if header:
            path: KeyPath = tuple(_split(header.group(2)))
            if header.group(1) == "[[":
                index = array_counts.get(path, 0)
                array_counts[path] = index + 1
                lines.setdefault(path, number)
                path = (*path, index)
            lines.setdefault(path, number)
            table = path
            continue
        assign = _ASSIGN.match(raw)
        if assign:
            key_path: KeyPath = (*table, *_split(assign.group(1)))
            for i in range(len(table) + 1, len(key_path) + 1):
                lines.setdefault(key_path[:i], number)
            value = assign.group(2).strip()
            in_string = _opens_multiline(value)
            if not in_string:
                depth = max(_bracket_depth(value), 0)
    return lines


def line_of(lines: dict[KeyPath, int], path: KeyPath) -> int | None:
    """The line of ``path``, or of its nearest parent that has one."""
    for end in range(len(path), 0, -1):
        found = lines.get(tuple(path[:end]))
        if found is not None:
            return found
    return None
