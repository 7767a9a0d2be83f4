"""What every model of the snapshot manifest shares: strict, frozen pydantic models (an unknown
key is an error, a value never changes once read) and the few constrained types they use."""

from __future__ import annotations

import logging
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)


class Strict(BaseModel):
    """A manifest model: unknown keys are refused and values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


Bytes = Annotated[int, Field(ge=0)]
#: Permission bits as octal text, four digits (``stat.S_IMODE``): 0644, 0755, 4755.
FileMode = Annotated[str, Field(pattern=r"^[0-7]{4}$")]


class Skipped(Strict):
    """A part of the snapshot that may not be looked at (no engine, no systemd): whether it was,
    and why not."""

    available: bool
    reason: str | None = None
