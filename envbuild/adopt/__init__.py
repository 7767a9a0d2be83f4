"""``envbuild adopt``: a hand-built environment becomes a spec, a lock and declared patches.

Its code is in :mod:`envbuild.adopt.core` and the modules beside it."""

from __future__ import annotations

from envbuild.adopt.core import Options, adopt
from envbuild.adopt.report import Adopted

__all__ = ["Adopted", "Options", "adopt"]
