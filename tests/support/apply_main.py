"""``python -m support.apply_main ARGS``: the envbuild CLI on a machine with fake GPUs and a
fake systemd (see :mod:`support.fakesystemd`), for tests that run apply as a real process (to
kill it, or to run two at once). ``FAKE_HOST`` may hold JSON keyword arguments for fake_host."""

from __future__ import annotations

import functools
import json
import os
import sys

from envbuild.apply import host as hostmod
from envbuild.cli import main
from support.fakesystemd import fake_host

if __name__ == "__main__":
    options = json.loads(os.environ.get("FAKE_HOST", "{}"))
    hostmod.real_host = functools.partial(fake_host, **options)  # type: ignore[assignment]
    sys.exit(main(sys.argv[1:]))
