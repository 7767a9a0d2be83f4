"""How the CLI shows things: JSON on stdout for scripts, text for people, errors on stderr."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import Any

from envbuild.fsio import canonical_json


class LaterHelp(str):
    """A help text made only when ``--help`` shows it (argparse fills a help text in with
    ``help % params``): for one whose facts cost an import that the command's parser should not
    pay for, as every command's parser is made before it runs."""

    _make: Callable[[], str]

    def __new__(cls, make: Callable[[], str]) -> LaterHelp:
        text = super().__new__(cls, "(made when shown)")
        text._make = make
        return text

    def __mod__(self, params: Any) -> str:
        text: str = self._make() % params
        return text


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")


#: Whether this command has put its JSON on stdout (then an error adds no second document).
_state = {"emitted": False}


def emit_json(obj: Any) -> None:
    _state["emitted"] = True
    sys.stdout.write(canonical_json(obj))


def reset_json() -> None:
    _state["emitted"] = False


def emit_json_error(exc: BaseException, exit_code: int) -> None:
    """Under ``--json``, a failure is a JSON document on stdout too (a script reading stdout
    learns what went wrong, not only that something did), unless the command already wrote
    its own. The text on stderr stays as it is."""
    if _state["emitted"]:
        return
    if isinstance(exc, KeyboardInterrupt):
        message = "interrupted"
    else:
        message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
    error: dict[str, Any] = {
        "kind": getattr(exc, "kind", None) or type(exc).__name__,  # a stage's: its cause's
        "message": message,
        "hint": getattr(exc, "hint", None),
        "exit_code": exit_code,
    }
    if problems := getattr(exc, "problems", None):
        error["problems"] = [p.as_dict() for p in problems]
    emit_json({"error": error})


def echo(text: str = "") -> None:
    sys.stdout.write(text + "\n")


class _Output:
    #: ``-q``: :func:`note` writes nothing (set by :func:`setup_logging`; errors still show)
    quiet = False


def note(text: str = "") -> None:
    """A line for people that is not the command's output (progress, a summary, a hint): on
    stderr, so stdout stays the result (a digest, a document); nothing under ``-q``."""
    if not _Output.quiet:
        sys.stderr.write(text + "\n")


def error_lines(lines: list[str]) -> None:
    if not lines:
        return
    sys.stderr.write(f"error: {lines[0]}\n")
    for line in lines[1:]:
        sys.stderr.write(f"{line}\n")


def problem_lines(lines: list[str]) -> None:
    """Located problems already say their severity; print them as they are."""
    for line in lines:
        sys.stderr.write(f"{line}\n")


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        if record.levelno >= logging.WARNING:
            return f"{record.levelname.lower()}: {msg}"
        return msg


def setup_logging(verbose: int, quiet: bool) -> logging.Handler:
    """Route the core's log records to stderr (``quiet``: warnings and errors only, and no
    :func:`note`). Returns the handler so the caller can remove it."""
    _Output.quiet = quiet
    logger = logging.getLogger("envbuild")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter())
    level = logging.WARNING if quiet else (logging.DEBUG if verbose else logging.INFO)
    handler.setLevel(level)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    return handler


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def to_toml(data: dict[str, Any]) -> str:
    """TOML text for a JSON-like mapping (keys with no value are left out: TOML has no null)."""
    import tomli_w

    return tomli_w.dumps(_drop_none(data))
