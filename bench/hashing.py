"""The snapshot's forked worker pool against the hand-written fork pool it replaced, on one tree.

    python3 bench/hashing.py                       # the repository's .venv, 3 rounds
    python3 bench/hashing.py --tree /opt/torch/.venv --rounds 5 --json out.json

Both pools hash every regular file of the tree (``hash_files``, the full check's path) and then
look at their sizes only (``stat_only``, the quick check's path), one worker per core, forked
whatever the tree's size (``ENGINE = "processes"``). The old pool is the module as it was at
:data:`OLD`, read from git. The page cache is warmed first; each round runs both, in an order
that alternates from round to round, and both must give the same answers. Medians per pool and
the ratio (new / old: below 1 means the new pool is faster) are printed and written to
``bench/results/hashing.json``. The machine may be shared: the load average (``os.getloadavg``)
before and after is part of the result.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from envbuild.snapshot import hashing  # noqa: E402

#: The commit whose envbuild/snapshot/hashing.py holds the hand-written fork pool.
OLD = "fb6f848"


def old_module() -> types.ModuleType:
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{OLD}:envbuild/snapshot/hashing.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    module = types.ModuleType("old_hashing")
    module.__file__ = f"{OLD}:envbuild/snapshot/hashing.py"
    sys.modules[module.__name__] = module
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def files_of(tree: Path) -> list[tuple[str, int]]:
    out = []
    for folder, _, names in os.walk(tree):
        for name in names:
            path = os.path.join(folder, name)
            if os.path.isfile(path) and not os.path.islink(path):
                out.append((path, os.path.getsize(path)))
    return sorted(out)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    got = fn()
    return time.perf_counter() - start, got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", type=Path, default=ROOT / ".venv")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "hashing.json")
    args = ap.parse_args()

    old = old_module()
    pools = {"fork pool (old)": old, "multiprocessing (new)": hashing}
    for module in pools.values():
        module.ENGINE = "processes"  # type: ignore[attr-defined]
    items = files_of(args.tree)
    total = sum(size for _, size in items)
    workers = os.cpu_count() or 1
    load_before = os.getloadavg()
    print(f"{len(items)} files, {total / 1e6:.0f} MB, {workers} workers, load {load_before}")
    for path, _ in items:  # warm the page cache
        with open(path, "rb") as f:
            while f.read(1 << 20):
                pass

    times: dict[str, dict[str, list[float]]] = {look: {} for look in ("hash", "stat")}
    for round_ in range(args.rounds):
        order = list(pools) if round_ % 2 == 0 else list(reversed(pools))
        for look in ("hash", "stat"):
            answers = []
            for name in order:
                module = pools[name]
                assert module.forkable(), "a thread is running: the pools would not fork"
                seconds, got = timed(
                    lambda m=module, s=look == "stat": m.hash_files(
                        items, workers=workers, stat_only=s
                    )
                )
                times[look].setdefault(name, []).append(seconds)
                answers.append({p: tuple(fh) for p, fh in got.items()})
                print(f"round {round_ + 1} {look} {name}: {seconds:.3f} s", flush=True)
            assert answers[0] == answers[1], f"the pools disagree ({look})"
    load_after = os.getloadavg()

    result: dict[str, Any] = {
        "tree": str(args.tree.relative_to(ROOT) if args.tree.is_relative_to(ROOT) else args.tree),
        "files": len(items),
        "bytes": total,
        "workers": workers,
        "rounds": args.rounds,
        "old": f"{OLD}:envbuild/snapshot/hashing.py",
        "python": platform.python_version(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
        "looks": {},
    }
    for look, by_pool in times.items():
        medians = {name: statistics.median(ts) for name, ts in by_pool.items()}
        ratio = medians["multiprocessing (new)"] / medians["fork pool (old)"]
        result["looks"][look] = {
            "seconds": {name: [round(t, 4) for t in ts] for name, ts in by_pool.items()},
            "median_s": {name: round(m, 4) for name, m in medians.items()},
            "ratio_new_over_old": round(ratio, 3),
        }
        print(
            f"{look}: median old {medians['fork pool (old)']:.3f} s, "
            f"new {medians['multiprocessing (new)']:.3f} s, new/old {ratio:.2f}"
        )
    print(f"load average before {load_before}, after {load_after}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
