"""Is an installed distribution the published wheel? The wheel's RECORD against the installed one.

Input: a wheel file and the installed distribution's RECORD text. Output: :class:`Comparison`,
the paths (relative to site-packages) whose RECORD lines differ or that only one side lists,
leaving out what installers write or rewrite themselves: entry-point scripts and everything
else installed outside site-packages (``../../bin/…``, a wheel's ``.data/scripts``), the
``INSTALLER``, ``REQUESTED``, ``direct_url.json`` and ``uv_cache.json`` they add, ``RECORD``
itself, and bytecode (``__pycache__``). A wheel's ``.data/purelib`` and ``.data/platlib`` files
install into site-packages and are compared there. The lines are compared as written
(``sha256=…`` and size), so a wheel whose RECORD was wrong as shipped matches the RECORD an
installer copied from it.

:func:`member` gives the published bytes of one installed path (what a patch is made against).
"""

from __future__ import annotations

import hashlib
import posixpath
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from envbuild.errors import InputFileError
from envbuild.fsio import record_digest
from envbuild.snapshot import records
from envbuild.snapshot.contents import INSTALLER_FILES

_INTO_SITE = ("purelib", "platlib")


@dataclass(frozen=True)
class Comparison:
    same: bool
    compared: int = 0
    differ: list[str] = field(default_factory=list)  # listed on both sides, other lines
    only_wheel: list[str] = field(default_factory=list)
    only_installed: list[str] = field(default_factory=list)


def installed_path(member: str) -> str | None:
    """Where a wheel's member is installed, relative to site-packages; None: outside it (the
    .data folders for scripts, headers and data) or a file installers write themselves."""
    parts = member.split("/")
    if len(parts) >= 3 and parts[0].endswith(".data"):
        return "/".join(parts[2:]) if parts[1] in _INTO_SITE else None
    return None if _ignored(member) else member


def _ignored(rel: str) -> bool:
    parts = rel.split("/")
    if "__pycache__" in parts:
        return True
    return len(parts) == 2 and parts[0].endswith(".dist-info") and parts[1] in INSTALLER_FILES


def _normal(rel: str) -> str | None:
    """An installed RECORD path as a site-packages path; None when outside or ignored."""
    if not rel or rel.startswith("/") or "\\" in rel:
        return None
    norm = posixpath.normpath(rel)
    if norm.startswith("../") or norm == "..":
        return None
    return None if _ignored(norm) else norm


def _lines(text: str) -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    for row in records.rows(text):
        rel = _normal(row[0])
        if rel is not None:
            out[rel] = (row[1] if len(row) > 1 else "", row[2] if len(row) > 2 else "")
    return out


def _digest(data: bytes) -> str:
    return "sha256=" + record_digest(hashlib.sha256(data).digest())


def wheel_lines(wheel: Path) -> dict[str, tuple[str, str]]:
    """The wheel's RECORD lines by installed path; a member its RECORD gives no hash for gets
    the hash of its bytes."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = [i.filename for i in zf.infolist() if not i.is_dir()]
            record = next((n for n in names if _is_record(n)), None)
            listed: dict[str, tuple[str, str]] = {}
            if record is not None:
                for row in records.rows(records.lines(zf.read(record))):
                    listed[row[0]] = (
                        row[1] if len(row) > 1 else "",
                        row[2] if len(row) > 2 else "",
                    )
            out: dict[str, tuple[str, str]] = {}
            for name in names:
                rel = installed_path(name)
                if rel is None:
                    continue
                hashed, size = listed.get(name, ("", ""))
                if not hashed:
                    data = zf.read(name)
                    hashed, size = _digest(data), str(len(data))
                out[rel] = (hashed, size)
            return out
    except (zipfile.BadZipFile, OSError) as exc:
        raise InputFileError(wheel, f"is not a readable wheel: {exc}") from None


def _is_record(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and parts[0].endswith(".dist-info") and parts[1] == "RECORD"


def compare(wheel: Path, installed_record: str) -> Comparison:
    """The wheel's RECORD against the installed distribution's (see the module's rules)."""
    published = wheel_lines(wheel)
    installed = _lines(installed_record)
    both = sorted(set(published) & set(installed))
    differ = [p for p in both if not _same_line(published[p], installed[p])]
    only_wheel = sorted(set(published) - set(installed))
    only_installed = sorted(set(installed) - set(published))
    return Comparison(
        same=not (differ or only_wheel or only_installed),
        compared=len(both),
        differ=differ,
        only_wheel=only_wheel,
        only_installed=only_installed,
    )


def _same_line(a: tuple[str, str], b: tuple[str, str]) -> bool:
    # a size one side leaves out is not a difference; the hash always is
    return a[0] == b[0] and (not a[1] or not b[1] or a[1] == b[1])


def member(wheel: Path, rel: str) -> bytes | None:
    """The published bytes of the file installed at ``rel`` (site-packages relative), or None
    when the wheel has no such file."""
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if not info.is_dir() and installed_path(info.filename) == rel:
                return zf.read(info)
    return None
