"""What a venv on disk lists: its files and symlinks, its folders, the folders above a set of
paths, and a path as a RECORD names it. Plain folder listings (no stat of each file): a kimi
generation holds some 60,000 entries."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def shown(rel: str) -> str:
    """A venv path as a RECORD names it: relative to site-packages where it is inside."""
    parts = rel.split(os.sep)
    if len(parts) > 3 and parts[0] == "lib" and parts[2] == "site-packages":
        return os.sep.join(parts[3:])
    return rel


def listing(venv: Path) -> list[str]:
    """Every file and symlink under ``venv``, venv-relative (a folder's listing, no stat)."""
    out = []
    skip = len(str(venv)) + 1
    for top, dirs, names in os.walk(venv):
        out += [os.path.join(top, name)[skip:] for name in names]
        out += [os.path.join(top, d)[skip:] for d in dirs if os.path.islink(os.path.join(top, d))]
    return out


def folders(venv: Path) -> list[str]:
    """Every folder under ``venv`` (not a symlink to one), venv-relative."""
    out = []
    skip = len(str(venv)) + 1
    for top, dirs, _names in os.walk(venv):
        out += [
            os.path.join(top, d)[skip:] for d in dirs if not os.path.islink(os.path.join(top, d))
        ]
    return out


def ancestors(rels: Iterable[str]) -> set[str]:
    """Every folder above each of ``rels`` (venv-relative), up to the venv's root."""
    out: set[str] = set()
    for rel in rels:
        folder = os.path.dirname(rel)
        while folder and folder not in out:
            out.add(folder)
            folder = os.path.dirname(folder)
    return out
