"""Run `envbuild ARGS…` and die (``os._exit(137)``, as SIGKILL leaves a process: no cleanup,
no ``finally``) at the N-th file-system step of writing the output folder.

    python tests/support/killpoint.py N build --output X SPEC   # N = 0: never; prints the count
    KILLPOINT_PAUSE=N:FILE python tests/support/killpoint.py 0 build …   # wait at step N
    KILLPOINT_PAUSE=N:FILE:S …   # wait S seconds there, then go on

The steps counted, from the moment the image stage starts writing the folder: every
``os.replace``, ``os.rename``, ``os.link``, ``os.unlink``, ``os.fsync``, ``os.mkdir`` and every
1 MiB buffer of a tar written out. With N = 0 the run finishes and the last line of stderr
says how many steps it took (``killpoint steps: K``), so a test can pick points among them. A
pause waits at the first step from N on that the main thread takes (where Ctrl-C lands).

The run stands for ``envbuild build`` in a terminal's foreground, where Ctrl-C interrupts it, so
SIGINT raises KeyboardInterrupt here whatever the parent left: a process started with SIGINT
ignored keeps it ignored across exec, and Python then installs no handler for it. A test run
started in the background of a script (``pytest … &``: the shell ignores SIGINT in it) passes
that on to every child, and a Ctrl-C test's build would sleep out its pause and finish.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import envbuild.pipeline.core as build_mod
from envbuild.build import outputs, tarwrite
from envbuild.cli.main import main

signal.signal(signal.SIGINT, signal.default_int_handler)
KILL_AT = int(sys.argv[1])
state = {"steps": 0, "armed": False, "paused": False}


LOG = os.environ.get("KILLPOINT_LOG")
#: ``N:FILE``: at step N, create FILE and wait there for a signal (a test sends SIGKILL or SIGINT);
#: ``N:FILE:S``: wait S seconds there, then go on
PAUSE = os.environ.get("KILLPOINT_PAUSE", "")
_PARTS = PAUSE.split(":")
PAUSE_AT, PAUSE_FILE = [*_PARTS, ""][:2] if PAUSE else ["0", ""]
PAUSE_FOR = _PARTS[2] if len(_PARTS) > 2 else "60"


def count(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if state["armed"]:
            state["steps"] += 1
            if state["steps"] == KILL_AT:
                os._exit(137)
            if (
                PAUSE
                and not state["paused"]
                and state["steps"] >= int(PAUSE_AT)
                and threading.current_thread() is threading.main_thread()
            ):
                # in the main thread only, where a signal lands: a pause in a worker thread
                # would hold the process's exit after Ctrl-C for the whole sleep
                state["paused"] = True
                open(PAUSE_FILE, "w").close()
                time.sleep(float(PAUSE_FOR))
            if LOG:
                with open(LOG, "a") as f:
                    f.write(f"{state['steps']} {name} {' '.join(map(str, args[:2]))}\n")
        return fn(*args, **kwargs)

    return wrapper


for name in ("replace", "rename", "link", "unlink", "fsync", "mkdir"):
    setattr(os, name, count(name, getattr(os, name)))
tarwrite.Sink.flush = count("tar-buffer", tarwrite.Sink.flush)  # type: ignore[method-assign]
real_write_outputs = outputs.write_outputs


def write_outputs(*args: Any, **kwargs: Any) -> Any:
    state["armed"] = True
    try:
        return real_write_outputs(*args, **kwargs)
    finally:
        state["armed"] = False


outputs.write_outputs = write_outputs  # type: ignore[assignment]
build_mod.write_outputs = write_outputs  # type: ignore[assignment]

code = main(sys.argv[2:])
print(f"killpoint steps: {state['steps']}", file=sys.stderr)
sys.exit(code)
