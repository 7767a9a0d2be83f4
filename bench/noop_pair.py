#!/usr/bin/env python3
"""The no-op rebuild of two already-built images, each by its own checkout, in one run (not a
test): for a big image and a checkout whose lock name or format differs, where bench/noop.py
(one store built by this checkout, copied for both) does not fit.

    python3 bench/noop_pair.py --runs 11 \\
        --side before=CODE,SPEC,STORE,OUT --side this=.,specs/kimi-nvfp4.toml,STORE2,OUT2

Each side was built before, without a docker archive (``envbuild build SPEC --store STORE
--output OUT --no-docker-archive`` by that side's checkout, SPEC in a repository of that
checkout's lock). The runs alternate; each is a fresh interpreter that times only
``envbuild.pipeline.core.build`` (imports and spec loading excluded) and fails if it rebuilt a
layer.
Prints the medians, ranges, their ratio, the digests and the load averages as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ONE = """
import sys, time
sys.path.insert(0, {code!r})
from pathlib import Path
from envbuild.build import pipeline as build
from envbuild.spec import load_spec
from envbuild.store.core import Store
loaded = load_spec({spec!r})
start = time.perf_counter()
r = build.build(loaded, store=Store(Path({store!r})), output=Path({out!r}), docker_archive=False)
took = time.perf_counter() - start
assert not r.rebuilt, r.rebuilt
print(took, r.manifest.image)
"""


def once(code: str, spec: str, store: str, out: str) -> tuple[float, str]:
    src = ONE.format(code=code, spec=spec, store=store, out=out)
    done = subprocess.run(
        [sys.executable, "-c", src], capture_output=True, text=True, check=False, cwd=code
    )
    if done.returncode:
        raise SystemExit(f"{code}: {done.stderr}")
    took, image = done.stdout.split()
    return float(took), image


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--side", action="append", required=True, help="NAME=CODE,SPEC,STORE,OUT")
    ap.add_argument("--runs", type=int, default=11)
    args = ap.parse_args()
    os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")
    sides = {}
    for side in args.side:
        name, _, rest = side.partition("=")
        code, spec, store, out = (os.path.abspath(p) for p in rest.split(","))
        sides[name] = (code, spec, store, out)
        once(code, spec, store, out)  # the first may record what it checks
    times: dict[str, list[float]] = {name: [] for name in sides}
    images: dict[str, set[str]] = {name: set() for name in sides}
    loads = []
    for _ in range(args.runs):
        loads.append(os.getloadavg()[0])
        for name, where in sides.items():
            took, image = once(*where)
            times[name].append(took)
            images[name].add(image)
    med = {k: statistics.median(v) for k, v in times.items()}
    names = list(sides)
    print(
        json.dumps(
            {
                "runs": args.runs,
                "seconds": times,
                "median_s": med,
                "range_s": {k: [min(v), max(v)] for k, v in times.items()},
                f"ratio_{names[-1]}_over_{names[0]}": med[names[-1]] / med[names[0]],
                "images": {k: sorted(v) for k, v in images.items()},
                "load1": loads,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
