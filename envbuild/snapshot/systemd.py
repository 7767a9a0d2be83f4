"""systemd units matching a pattern (default ``vllm*``): state, ExecStart and environment, with
secrets redacted. Through ``systemctl`` (via :func:`envbuild.proc.core.run`), which any user may
ask."""

from __future__ import annotations

import logging
import shlex
from pathlib import Path

from envbuild.errors import EnvironmentFailure
from envbuild.proc import core as proc
from envbuild.snapshot.model.services import Service, SystemdSection
from envbuild.snapshot.redact import Redactor

log = logging.getLogger(__name__)

DEFAULT_PATTERN = "vllm*"
_PROPERTIES = (
    "Id",
    "LoadState",
    "ActiveState",
    "SubState",
    "UnitFileState",
    "FragmentPath",
    "ExecStart",
    "Environment",
)


def parse_show(text: str) -> list[dict[str, str]]:
    """``systemctl show`` output: blocks of KEY=VALUE separated by blank lines."""
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, _, value = line.partition("=")
        current[key] = value
    if current:
        blocks.append(current)
    return blocks


def parse_exec_start(value: str) -> list[str]:
    """``{ path=… ; argv[]=/usr/bin/vllm serve … ; ignore_errors=no ; … }`` → the argv."""
    start = value.find("argv[]=")
    if start < 0:
        return shlex.split(value) if value else []
    rest = value[start + len("argv[]=") :]
    end = rest.find(" ; ")
    try:
        return shlex.split(rest if end < 0 else rest[:end])
    except ValueError:
        return (rest if end < 0 else rest[:end]).split()


def parse_environment(value: str) -> dict[str, str]:
    try:
        words = shlex.split(value)
    except ValueError:
        words = value.split()
    env: dict[str, str] = {}
    for word in words:
        key, sep, val = word.partition("=")
        if sep:
            env[key] = val
    return env


def to_service(block: dict[str, str], redactor: Redactor) -> Service:
    unit = block.get("Id", "?")
    return Service(
        unit=unit,
        load_state=block.get("LoadState") or None,
        active_state=block.get("ActiveState") or None,
        sub_state=block.get("SubState") or None,
        unit_file_state=block.get("UnitFileState") or None,
        fragment_path=block.get("FragmentPath") or None,
        exec_start=redactor.argv(
            f"systemd.units[{unit}].exec_start", parse_exec_start(block.get("ExecStart", ""))
        ),
        environment=redactor.environment(
            f"systemd.units[{unit}].environment", parse_environment(block.get("Environment", ""))
        ),
    )


def running(root: Path = Path("/run/systemd/system")) -> bool:
    """systemd's own test (sd_booted): it is PID 1 when this folder exists."""
    return root.is_dir()


def read_units(pattern: str, redactor: Redactor) -> SystemdSection:
    if not running():
        return SystemdSection(available=False, reason="systemd is not running", pattern=pattern)
    try:
        systemctl = proc.which("systemctl")
        env = proc.child_env({"SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"})
        listed = proc.run(
            [systemctl, "list-units", "--all", "--plain", "--no-legend", "--no-pager", pattern],
            tool="systemctl",
            env=env,
            timeout=30,
        )
        units = sorted({line.split()[0] for line in listed.stdout.splitlines() if line.split()})
        if not units:
            return SystemdSection(available=True, pattern=pattern)
        shown = proc.run(
            [systemctl, "show", "--no-pager", "-p", ",".join(_PROPERTIES), "--", *units],
            tool="systemctl",
            env=env,
            timeout=30,
        )
    except (EnvironmentFailure, OSError) as exc:
        log.info("no systemd facts: %s", exc)
        return SystemdSection(available=False, reason=str(exc), pattern=pattern)
    services = [to_service(b, redactor) for b in parse_show(shown.stdout) if b.get("Id")]
    return SystemdSection(
        available=True, pattern=pattern, units=sorted(services, key=lambda s: s.unit)
    )
