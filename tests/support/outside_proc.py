"""The modules of envbuild that start processes without :mod:`envbuild.proc`, each with why it
may: one list for the argv audit (tests/test_argv_audit.py) and the signal tests
(tests/test_signals.py). Everything else goes through proc: the argv logged with secrets
redacted, a process group of its own that a signal stops, a typed error."""

from __future__ import annotations

OUTSIDE_PROC = {
    "sourcebuild/container_probe.py": (
        "runs inside the builder container, where envbuild is not installed: it cannot import "
        "envbuild.proc (its argvs are fixed; the container, started through proc, holds them)"
    ),
    "installed/hashing.py": (
        "forks hashing workers of its own (no exec), which it kills when interrupted (a signal "
        "raises in the parent's main thread)"
    ),
}
