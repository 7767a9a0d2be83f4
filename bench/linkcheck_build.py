"""The build's link check (the ``links`` stage) before and after a change, cold and from the
cache, alternating, on one store: the stage's time and the whole process's CPU seconds.

    python3 bench/linkcheck_build.py --before DIR --store S --output O [--rounds 2]

``DIR`` is another checkout (``git worktree add --detach DIR REV``); this checkout is *after*.
Each side has its own link-check cache under ``$TMPDIR``, emptied before its cold run. Every
run is ``bench/stages.py SPEC --redo links`` of that side. Prints a JSON line per run (with the
store's link-check report digests after it: the same findings are the same blob).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def run(tree: Path, cache: Path, args: argparse.Namespace) -> dict[str, object]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(tree)}
    env.setdefault("UV_CACHE_DIR", str(Path.home() / ".cache" / "uv"))
    cmd = [sys.executable, str(tree / "bench" / "stages.py"), str(tree / args.spec)]
    cmd += ["--store", str(args.store), "--output", str(args.output), "--no-docker-archive"]
    cmd += ["--redo", "links"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tree, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    data = json.loads(done.stdout)
    drv = [json.loads(p.read_text()) for p in sorted((args.store / "drv").glob("*.json"))]
    reports = sorted(d["outputs"]["report"] for d in drv if d.get("kind") == "links")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {
        "links_s": data["timings_s"].get("links"),
        "process_cpu_s": round(cpu, 2),
        "image": data["image"],
        "report": reports,
        "load": [round(x, 2) for x in data["loadavg_before"]],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--output", type=Path, required=True)
    ap.add_argument("--spec", default="specs/kimi-nvfp4.toml")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    caches = Path(tempfile.mkdtemp(prefix="linkcheck-bench-"))
    for rnd in range(args.rounds):
        for side, tree in (("before", args.before.resolve()), ("after", HERE)):
            for kind in ("cold", "cached"):
                cache = caches / side
                if kind == "cold":
                    shutil.rmtree(cache, ignore_errors=True)
                start = time.perf_counter()
                row = {"round": rnd, "side": side, "kind": kind, **run(tree, cache, args)}
                row["process_wall_s"] = round(time.perf_counter() - start, 2)
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
