"""Hand edits as a patch: unified diffs of files against the published wheel's bytes.

Input: per file, its path relative to site-packages, the published bytes (None: a file the
wheel does not have, one no RECORD lists) and the bytes on disk (None: the file was deleted).
Output: the text of one patch in the form envbuild applies
(:func:`envbuild.sourcebuild.patches.apply_patch`: ``patch -p1`` in the unpacked wheel, paths
``a/<path>`` (``/dev/null`` for a new file) and ``b/<path>``, no fuzz), or the reason a file
cannot be one: a patch holds text, so bytes that are not UTF-8 or hold a NUL are refused
(named, never dropped).

Lines are split at ``\\n`` only (a CR, form feed or other separator ``str.splitlines`` would
cut at stays inside its line), and a last line without a newline gets GNU diff's
``\\ No newline at end of file`` marker, so applying the patch gives the edited bytes exactly.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

NO_NEWLINE = "\\ No newline at end of file\n"


@dataclass(frozen=True)
class Edit:
    path: str  # relative to site-packages, '/'-separated
    before: bytes | None  # None: a new file (one no RECORD lists)
    after: bytes | None  # None: deleted


class NotText(ValueError):
    """Bytes a text patch cannot carry."""


def _text(data: bytes, what: str) -> str:
    if b"\0" in data:
        raise NotText(f"{what} holds NUL bytes (a binary file)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise NotText(f"{what} is not UTF-8 text") from None


def _lines(text: str) -> list[str]:
    out = text.split("\n")
    last = out.pop()  # '' when the text ends with a newline
    lines = [line + "\n" for line in out]
    if last:
        lines.append(last)
    return lines


def file_diff(edit: Edit) -> str:
    """The unified diff of one edit (empty when the bytes are the same). Raises
    :class:`NotText` for bytes a patch cannot hold."""
    old = _text(edit.before, "the published file") if edit.before is not None else ""
    new = _text(edit.after, "the edited file") if edit.after is not None else ""
    if edit.after is not None and edit.before is not None and old == new:
        return ""
    if edit.after is None and not edit.before:
        raise NotText("an empty file was deleted (a patch cannot say so)")
    if edit.before is None and not new:
        raise NotText("an empty new file (a patch cannot say so)")
    old_lines, new_lines = _lines(old), _lines(new)
    start = f"a/{edit.path}" if edit.before is not None else "/dev/null"
    to = f"b/{edit.path}" if edit.after is not None else "/dev/null"
    out: list[str] = []
    diff = difflib.unified_diff(old_lines, new_lines, start, to, n=3, lineterm="\n")
    for i, line in enumerate(diff):
        if i < 2 or line.endswith("\n"):  # the ---/+++ header
            out.append(line)
        else:  # a last line without a newline
            out.append(line + "\n" + NO_NEWLINE)
    return "".join(out)


def patch_text(edits: list[Edit]) -> str:
    """One patch of every edit, files in path order."""
    return "".join(file_diff(e) for e in sorted(edits, key=lambda e: e.path))
