"""``python -m support.apply_main ARGS``: the envbuild CLI on a machine with fake GPUs and a
fake systemd (see :mod:`support.fakesystemd`), for tests that run apply as a real process (to
kill it, or to run two at once). ``FAKE_HOST`` may hold JSON keyword arguments for fake_host.
``KILL_IN_TREES=N``: from the first install tree made on, die (``os._exit(137)``, as SIGKILL
leaves a process) at the N-th rename, link, chmod or replace."""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import Any

from envbuild.apply import host as hostmod
from envbuild.cli.main import main
from support.fakesystemd import fake_host


def kill_in_trees(at: int) -> None:
    from envbuild.store import trees

    state = {"steps": 0, "armed": False}
    real_create = trees.Trees.create

    def create(self: trees.Trees, *args: Any, **kwargs: Any) -> Any:
        state["armed"] = True
        return real_create(self, *args, **kwargs)

    trees.Trees.create = create  # type: ignore[method-assign]
    for name in ("rename", "link", "chmod", "replace"):
        real = getattr(os, name)

        def step(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            if state["armed"]:
                state["steps"] += 1
                if state["steps"] == at:
                    os._exit(137)
            return _real(*args, **kwargs)

        setattr(os, name, step)


if __name__ == "__main__":
    if at := int(os.environ.get("KILL_IN_TREES", "0")):
        kill_in_trees(at)
    options = json.loads(os.environ.get("FAKE_HOST", "{}"))
    hostmod.real_host = functools.partial(fake_host, **options)  # type: ignore[assignment]
    sys.exit(main(sys.argv[1:]))
