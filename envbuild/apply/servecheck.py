"""The unit's command checked by the vLLM it runs: the generation's own interpreter runs
:mod:`envbuild.apply.vllm_probe`, which builds ``vllm serve``'s real argument parser and parses
the exact arguments of ``ExecStart`` (parse only: no GPU is probed and no model is read).

A command the parser refuses would make the unit fail at start, after the old service has been
stopped; apply checks it before switching.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from envbuild import proc
from envbuild.errors import EnvironmentFailure

PROBE = Path(__file__).with_name("vllm_probe.py")
#: Importing vLLM takes seconds to tens of seconds on a busy machine.
TIMEOUT = 600.0


#: A generation is read-only and exactly its manifest: the probe runs its Python isolated
#: (``-I``) and writes no bytecode into it (``-B``; root would write into its 0555 folders).
PYTHON_FLAGS = ("-I", "-B")


def probe_env(overrides: dict[str, str] | None = None) -> dict[str, str]:
    """The probe's environment: the caller's, cleaned, and no bytecode written anywhere (also
    by a child the imported code starts, which ``-B`` does not reach)."""
    return proc.child_env({"PYTHONDONTWRITEBYTECODE": "1", **(overrides or {})},
                          drop=("PYTHONPYCACHEPREFIX",))  # fmt: skip


@dataclass(frozen=True)
class ParseResult:
    ok: bool | None  # None: the parser could not be loaded at all
    error: str | None = None


def serve_args(argv: Sequence[str]) -> list[str]:
    """The arguments after ``vllm serve`` of a unit's command."""
    if len(argv) < 2 or Path(argv[0]).name != "vllm" or argv[1] != "serve":
        raise EnvironmentFailure(f"the unit's command is not `vllm serve …`: {list(argv)[:3]}")
    return list(argv[2:])


def parse_commands(python: Path, commands: Sequence[Sequence[str]]) -> list[ParseResult]:
    """Parse each command (the arguments after ``vllm serve``) with the vLLM of ``python``."""
    done = proc.run(
        [str(python), *PYTHON_FLAGS, str(PROBE), "parse"],
        tool="vllm's argument parser",
        input=json.dumps([list(c) for c in commands]),
        env=probe_env(),
        timeout=TIMEOUT,
    )
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise EnvironmentFailure(
            f"vLLM's argument parser ({python}) answered no result: {done.stdout[-200:]!r}"
        ) from exc
    if isinstance(answer, dict):
        return [ParseResult(None, str(answer.get("error")))] * len(commands)
    return [ParseResult(a.get("ok"), a.get("error")) for a in answer]
