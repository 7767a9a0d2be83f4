"""What a failed command's exit status and last lines suggest: the hint an error carries
(:func:`failure_hint`, from the patterns in :data:`TOOL_FAILURES`). Beside ``errors.py``, at the
bottom of the layers; :mod:`envbuild.proc` and the lock's resolver use it."""

from __future__ import annotations

import re
import signal

TOOL_FAILURES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), hint)
    for pattern, hint in (
        (
            r"no space left on device|disk quota exceeded",
            "free disk space where it writes (the store, $TMPDIR, /dev/shm), or point "
            "ENVBUILD_STORE / TMPDIR elsewhere",
        ),
        (
            r"Unable to locate package|has no installation candidate",
            "a package of [base] packages is not in that suite and mirror: check its name",
        ),
        (
            r"does not have a Release file|File not found - |404\s+Not Found|Failed to fetch",
            "the mirror does not serve that suite: check [base] mirror and suite (a URL this "
            "machine reaches, like http://deb.debian.org/debian)",
        ),
        (
            r"Temporary failure resolving|Could not resolve|Name or service not known",
            "a host name did not resolve: check the URL, DNS and the proxy (https_proxy)",
        ),
        (
            r"certificate verify failed|SSL certificate problem|self[- ]signed certificate",
            "TLS verification failed: point SSL_CERT_FILE at the CA bundle that signs the "
            "server's (or the proxy's) certificate",
        ),
        (
            r"Connection refused|Connection timed out|Network is unreachable|Failed to connect",
            "the server did not answer: check the URL, the network and the proxy",
        ),
        (
            r"\b401\b|\b403\b|unauthorized|authentication required",
            "the server refused the credentials: check them (or log in) and rerun",
        ),
        (
            r"Permission denied|Operation not permitted",
            "it lacks a permission: run envbuild as root (mmdebstrap's root mode mounts), or "
            "check the paths named above",
        ),
    )
)


def failure_hint(returncode: int, output: str) -> str | None:
    """What a command's failure suggests, from its exit status and its last lines of output
    (:data:`TOOL_FAILURES`); None when they suggest nothing (its own words are shown anyway)."""
    if returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else ""
        cause = " (out of memory? see `dmesg`)" if returncode == -signal.SIGKILL else ""
        return f"it was killed by signal {-returncode} {name}{cause}".rstrip()
    for line in reversed(output.splitlines()):  # the last cause said is the nearest
        for pattern, hint in TOOL_FAILURES:
            if pattern.search(line):
                return hint
    return None
