#!/usr/bin/env python3
"""The no-op rebuild of an image, this checkout against another one, in one run (not a test).

    python3 bench/noop.py --baseline DIR            # cpu-stack; DIR: `git archive REV | tar -x`
    python3 bench/noop.py --baseline DIR --runs 9 --spec bench/specs/cpu-stack.toml

The first call builds the image cold into WORK's store with this checkout; every run then
rebuilds it (nothing to do) once with each checkout, alternating, each in a fresh interpreter
that times only ``envbuild.pipeline.core.build`` (imports excluded). Prints the medians and their
ratio as JSON. Each checkout has its own copy of the store and the output folder (``cp -a``,
hard links kept): what one writes cannot make the other's rebuild do more.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "bench")]

from build import make_repo  # noqa: E402

ONE = """
import sys, time
sys.path.insert(0, {code!r})
from pathlib import Path
from envbuild.build import pipeline as build
from envbuild.spec import load_spec
from envbuild.store.core import Store
loaded = load_spec({spec!r})
start = time.perf_counter()
r = build.build(loaded, store=Store({store!r}), output=Path({out!r}))
took = time.perf_counter() - start
assert {cold} or not r.rebuilt, r.rebuilt
print(took, r.manifest.image)
"""


def once(
    code: Path, spec: Path, store: Path, out: Path, *, cold: bool = False
) -> tuple[float, str]:
    src = ONE.format(code=str(code), spec=str(spec), store=str(store), out=str(out), cold=cold)
    done = subprocess.run(
        [sys.executable, "-c", src], capture_output=True, text=True, check=False, cwd=code
    )
    if done.returncode:
        raise SystemExit(f"{code}: {done.stderr}")
    took, image = done.stdout.split()
    return float(took), image


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/envbuild-bench-noop"))
    ap.add_argument("--baseline", type=Path, required=True, help="the other checkout")
    ap.add_argument("--spec", type=Path, default=REPO / "bench" / "specs" / "cpu-stack.toml")
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    store, out = work / "store", work / "out"
    spec = work / f"repo-{args.spec.stem}" / "specs" / args.spec.name
    if not (out / "build-manifest.json").is_file():
        spec = make_repo(work, args.spec.resolve())
        print("cold build …", file=sys.stderr, flush=True)
        once(REPO, spec, store, out, cold=True)
    places = {}
    for name, code in (("baseline", args.baseline.resolve()), ("this", REPO)):
        copy = work / f"copy-{name}"
        shutil.rmtree(copy, ignore_errors=True)
        copy.mkdir()
        subprocess.run(["cp", "-a", str(store), str(out), str(copy)], check=True)
        places[name] = (code, copy / "store", copy / "out")
        once(code, spec, copy / "store", copy / "out")  # the first may record what it checks
    times: dict[str, list[float]] = {"baseline": [], "this": []}
    images = set()
    for _ in range(args.runs):
        for name, (code, c_store, c_out) in places.items():
            took, image = once(code, spec, c_store, c_out)
            times[name].append(took)
            images.add(image)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        json.dumps(
            {
                "spec": args.spec.name,
                "runs": args.runs,
                "seconds": times,
                "median_s": med,
                "ratio_this_over_baseline": med["this"] / med["baseline"],
                "images": sorted(images),
                "loadavg": os.getloadavg(),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
