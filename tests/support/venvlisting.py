"""What a venv is on disk, as the equality tests compare it (a generation's venv against the
image's ``/opt/venv`` or against a plain ``uv pip sync``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def listing(venv: Path, *, bytecode: bool = True) -> dict[str, tuple[str, int, bytes | str]]:
    """Every entry under ``venv``: its kind, its mode without write bits, its bytes (or its
    link's target). ``bytecode=False`` leaves Python's bytecode caches out (written on import)."""
    out: dict[str, tuple[str, int, bytes | str]] = {}
    for top, dirs, names in os.walk(venv):
        for name in [*dirs, *names]:
            path = Path(top) / name
            rel = str(path.relative_to(venv))
            if not bytecode and "__pycache__" in rel:
                continue
            st_ = os.lstat(path)
            mode = stat.S_IMODE(st_.st_mode) & ~0o222
            if stat.S_ISLNK(st_.st_mode):
                out[rel] = ("link", 0, os.readlink(path))
            elif stat.S_ISDIR(st_.st_mode):
                out[rel] = ("dir", mode, b"")
            else:
                out[rel] = ("file", mode, path.read_bytes())
    return out
