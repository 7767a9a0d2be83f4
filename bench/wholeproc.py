"""Time ``envbuild`` as a whole process, as users feel it: interpreter start, imports, the work
and the exit (not a test). The bench scripts' in-process figures leave the start-up out.

    python3 bench/wholeproc.py [--baseline DIR] [--runs N] -- ARGS...   # `envbuild ARGS...`

Each run is a fresh ``python -m envbuild ARGS`` in the current folder; CPU seconds (user + sys)
come from the kernel's accounting of the child (``os.wait4``), wall seconds from a monotonic
clock. With ``--baseline DIR`` (another checkout, e.g. ``git worktree add /tmp/before main``)
the two alternate, A B A B …, and the ratio of the medians is printed too. Every figure comes
with the 1-minute load average at its start and end: on a shared machine a wall time means
little without it (CPU seconds are steadier). Bytecode should be compiled first
(``python -m compileall -q envbuild`` in each checkout) when ``PYTHONDONTWRITEBYTECODE`` is set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def load() -> float:
    return os.getloadavg()[0]


def run_once(argv: list[str], checkout: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """One ``python -P -m envbuild ARGV`` with ``checkout`` first on ``sys.path`` (``-P``: the
    current folder is not, so ``PYTHONPATH`` decides which envbuild runs): its wall seconds,
    CPU seconds (the kernel's, from ``wait4``), exit code and stderr."""
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(checkout)}
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "envbuild", *argv],
            env=env, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        text = err.read().decode(errors="replace")
    cpu = usage.ru_utime + usage.ru_stime
    return {"wall": wall, "cpu": cpu, "code": proc.returncode, "stderr": text}


def timed(
    argv: list[str], checkouts: dict[str, Path], runs: int = 7, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Medians of ``runs`` whole-process runs of ``envbuild ARGV`` with each checkout (taking
    turns, after one warm-up each), CPU and wall seconds, and the load average around them."""
    out: dict[str, Any] = {"argv": argv, "load_start": round(load(), 2)}
    samples: dict[str, dict[str, list[float]]] = {k: {"wall": [], "cpu": []} for k in checkouts}
    for i in range(runs + 1):
        for name, checkout in checkouts.items():
            got = run_once(argv, checkout, env)
            if got["code"] != 0:
                raise SystemExit(f"{name}: envbuild {' '.join(argv)} exited {got['code']}:\n"
                                 f"{got['stderr']}")  # fmt: skip
            if i == 0:
                continue  # the warm-up: caches, bytecode
            samples[name]["wall"].append(got["wall"])
            samples[name]["cpu"].append(got["cpu"])
    out["load_end"] = round(load(), 2)
    for name, s in samples.items():
        out[name] = {k: round(statistics.median(v), 3) for k, v in s.items()}
    if len(checkouts) == 2:
        a, b = list(checkouts)
        out["ratio"] = {k: round(out[a][k] / out[b][k], 3) for k in ("wall", "cpu")}
    return out


def line(result: dict[str, Any]) -> str:
    """One Markdown table row: the command, each checkout's median CPU and wall, the ratio, and
    the load average."""
    names = [k for k, v in result.items() if k != "ratio" and isinstance(v, dict) and "cpu" in v]
    cells = [f"`envbuild {' '.join(result['argv'])}`"]
    cells += [f"{result[n]['cpu']:.3f} / {result[n]['wall']:.3f}" for n in names]
    if "ratio" in result:
        cells.append(f"{result['ratio']['cpu']:.2f} / {result['ratio']['wall']:.2f}")
    cells.append(f"{result['load_start']:.1f} to {result['load_end']:.1f}")
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="another checkout to compare with")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("args", nargs="+", help="envbuild's arguments (after --)")
    opts = parser.parse_args(argv)
    checkouts = {"this": REPO}
    if opts.baseline is not None:
        checkouts["baseline"] = opts.baseline.resolve()
    result = timed(opts.args, checkouts, opts.runs)
    print(json.dumps(result), file=sys.stderr)
    print(line(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
