"""The golden build plans under ``tests/cases/build/<name>/``.

A case folder holds ``spec.toml`` (the spec), ``pylock.<name>.toml`` (its lock, the name
:func:`envbuild.lock.core.lock_path` gives it), any file the spec names (patches), and
``plan.json``: the :class:`envbuild.build.plan.Plan` that
:func:`envbuild.pipeline.planner.make_plan` computes from them. ``_shared/`` is copied into
``specs/`` of every case (``extends = "base/rtx-pro-6000-8x.toml"``). The seed cases are copies
of ``specs/<name>.toml`` and ``lockfiles/pylock.<name>.toml``.

A plan reads no network and no docker. What it would read from this machine is fixed here: the
installer and compressor versions (part of every layer's key) are placeholders, and
``SOURCE_DATE_EPOCH`` is unset. Each case runs in a fresh repository: ``<tmp>/.git``, the
spec as ``<tmp>/specs/<name>.toml`` beside the case's other files, the lock in
``<tmp>/lockfiles/``. Refresh the golden files with ``python tests/build/regen.py [NAME...]``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from envbuild.fsio import canonical_json
from envbuild.pipeline.planner import load_lock, make_plan
from envbuild.spec import load_spec

CASES = Path(__file__).resolve().parent.parent / "cases" / "build"
SHARED = CASES / "_shared"
#: Stand-ins for ``uv --version`` and the compressor's version on the machine that plans.
INSTALLER = "uv 0.0.0 (golden)"
COMPRESSOR = "zstd 0.0.0 (golden) -3"


def case_names() -> list[str]:
    return sorted(p.name for p in CASES.iterdir() if p.is_dir() and not p.name.startswith("_"))


def materialize(name: str, into: Path) -> Path:
    """Lay case ``name`` out as a repository under ``into``; return the spec's path."""
    (into / ".git").mkdir(parents=True, exist_ok=True)
    specs, locks = into / "specs", into / "lockfiles"
    locks.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("plan.json", "spec.toml", "pylock.*.toml")
    shutil.copytree(CASES / name, specs, ignore=ignore)
    if SHARED.is_dir():
        shutil.copytree(SHARED, specs, dirs_exist_ok=True)
    shutil.copyfile(CASES / name / "spec.toml", specs / f"{name}.toml")
    for lock in (CASES / name).glob("pylock.*.toml"):
        shutil.copyfile(lock, locks / lock.name)
    return specs / f"{name}.toml"


@contextmanager
def _no_source_date_epoch() -> Iterator[None]:
    saved = os.environ.pop("SOURCE_DATE_EPOCH", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["SOURCE_DATE_EPOCH"] = saved


def compute(name: str, workdir: Path) -> dict[str, Any]:
    """The plan of case ``name`` as JSON data, computed in a fresh repository under ``workdir``."""
    loaded = load_spec(materialize(name, workdir))
    with _no_source_date_epoch():
        lock, lock_hash = load_lock(loaded)
        plan = make_plan(
            loaded, lock, lock_hash=lock_hash, installer=INSTALLER, compressor=COMPRESSOR
        )
    data: dict[str, Any] = json.loads(canonical_json(plan.model_dump(mode="json")))
    return data


def plan_text(data: dict[str, Any]) -> str:
    """``plan.json`` as it is written: canonical JSON, indented for review, trailing newline."""
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def load_expected(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CASES / name / "plan.json").read_text("utf-8"))
    return data
