"""Which paths a wheel will write, and where each member lands in the image's venv, read from
the wheel's RECORD and entry points before anything is installed (what the overlap check and the
link check compare).
"""

from __future__ import annotations

import csv
import io
import logging
import zipfile
from pathlib import Path, PurePosixPath

from envbuild.errors import InputFileError
from envbuild.installed.venv import VenvTarget

log = logging.getLogger(__name__)


def wheel_files(wheel: Path, target: VenvTarget) -> dict[str, str]:
    """Every path the wheel installs, relative to the venv, with its RECORD hash ('' if none).

    Read from the wheel's RECORD and entry points, before anything is installed, so overlaps
    between distributions are found without letting install order decide.
    """
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = zf.namelist()
            record = next((n for n in names if _is_dist_info(n, "RECORD")), None)
            entry = next((n for n in names if _is_dist_info(n, "entry_points.txt")), None)
            rows = (
                list(csv.reader(io.StringIO(zf.read(record).decode())))
                if record
                else [[n] for n in names]
            )
            entry_text = zf.read(entry).decode() if entry else ""
    except (OSError, zipfile.BadZipFile, KeyError, UnicodeDecodeError) as exc:
        raise InputFileError(wheel.name, f"is not a readable wheel: {exc}") from None
    out: dict[str, str] = {}
    for row in rows:
        if not row or row[0].endswith("/"):
            continue
        path = _install_path(row[0], target)
        if path is not None:
            out[path] = row[1] if len(row) > 1 else ""
    for script in _console_scripts(entry_text):
        out[f"bin/{script}"] = ""
    return out


def _is_dist_info(name: str, leaf: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and parts[0].endswith(".dist-info") and parts[1] == leaf


def member_path(member: str, target: VenvTarget) -> str | None:
    """Where a wheel's member lands, relative to the venv (None: a scheme uv does not install)."""
    return _install_path(member, target)


def _install_path(member: str, target: VenvTarget) -> str | None:
    split = member.split("/")
    plain = "" not in split and "." not in split  # nothing for pathlib to normalise
    parts = tuple(split) if plain else PurePosixPath(member).parts
    if not parts:
        return None
    if parts[0].endswith(".data") and len(parts) > 2:
        scheme, rest = parts[1], PurePosixPath(*parts[2:])
        if scheme in ("purelib", "platlib"):
            return f"{target.site_packages}/{rest}"
        if scheme == "scripts":
            return f"bin/{rest}"
        if scheme == "headers":
            return f"include/site/python{target.python_version}/{rest}"
        if scheme == "data":
            return str(rest)
        return None
    return f"{target.site_packages}/{member if plain else PurePosixPath(*parts)}"


def _console_scripts(entry_points: str) -> list[str]:
    names: list[str] = []
    section = ""
    for raw in entry_points.splitlines():
        line = raw.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
        elif "=" in line and section in ("console_scripts", "gui_scripts"):
            names.append(line.split("=", 1)[0].strip())
    return names


def _rows(record: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(record)))
