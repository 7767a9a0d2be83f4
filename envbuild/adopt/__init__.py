"""``envbuild adopt``: a hand-built environment becomes a spec, a lock and declared patches.

:func:`adopt` (in :mod:`envbuild.adopt.core`) runs the stages; each module has one job:
:mod:`.index` (what an index publishes), :mod:`.wheelrecord` (a published wheel's RECORD against
the installed one), :mod:`.diffs` (hand edits as a patch), :mod:`.builds` (what a locally built
distribution's files say), :mod:`.hostfacts` and :mod:`.serving` (the machine and its unit as
spec tables), :mod:`.specfile` (the files written) and :mod:`.report` (the result).
"""

from __future__ import annotations

from envbuild.adopt.core import Options, adopt
from envbuild.adopt.report import Adopted

__all__ = ["Adopted", "Options", "adopt"]
