"""How fast `envbuild snapshot` checks a big venv against its RECORDs, next to the machine's
sha256 limit measured in the same run.

    python3 bench/integrity.py                    # builds /var/tmp/envbuild-bench/vllm-venv once
    python3 bench/integrity.py --venv /opt/torch/.venv --repeat 5 --json out.json

Builds (or reuses) a vLLM 0.33 venv with uv, then measures:
* the sha256 limit: hashlib over an in-memory buffer, one thread and all cores;
* the full integrity check (every recorded file hashed): time and GB/s, cold page cache when
  caches can be dropped (root), then warm (median of --repeat);
* the quick check (sizes; hashes only files newer than their install): median time;
* the paths owned by two distributions, by owner pair.
Load average is printed before and after: the machine may be shared.
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
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from envbuild import proc
from envbuild.snapshot import hashing
from envbuild.snapshot.hashing import sha256_limit
from envbuild.snapshot.model import PythonEnv
from envbuild.snapshot.pyenv import Interpreter, Mode, probe, scan_site_packages

DEFAULT_VENV = Path("/var/tmp/envbuild-bench/vllm-venv")


def build(venv: Path, requirement: str) -> None:
    env = proc.child_env({"UV_PYTHON_DOWNLOADS": "never", "VIRTUAL_ENV": str(venv)})
    uv = proc.find_uv()
    venv.parent.mkdir(parents=True, exist_ok=True)
    print(f"building {venv} with {requirement} (a few minutes of download) …", flush=True)
    proc.run([uv, "venv", "-q", "-p", sys.executable, str(venv)], env=env, stream=True)
    proc.run([uv, "pip", "install", requirement], env=env, stream=True)


def drop_caches() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def _read_batch(batch: list[str]) -> int:
    done = 0
    for path in batch:
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(1 << 22):
                done += len(chunk)
    return done


def cold_read(files: list[tuple[str, int]]) -> float:
    """Seconds to read every file once from a cold cache, one process per core, no hashing:
    what the disk allows."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    batches = hashing._batches(files)
    drop_caches()
    start = time.perf_counter()
    with ProcessPoolExecutor(os.cpu_count(), mp_context=mp.get_context("fork")) as pool:
        sum(pool.map(_read_batch, batches))
    return time.perf_counter() - start


def timed_check(interp: Interpreter, mode: Mode) -> tuple[float, PythonEnv]:
    start = time.perf_counter()
    env = scan_site_packages(interp, mode)
    return time.perf_counter() - start, env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    ap.add_argument("--requirement", default="vllm==0.33.0")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, help="write the figures here too")
    ap.add_argument("--cold-read", action="store_true", help="also time a plain cold read (root)")
    ap.add_argument(
        "--sweep",
        default="",
        help="also time the warm full check with these engines: t8 = 8 threads, p16 = 16 processes",
    )
    args = ap.parse_args()

    if not (args.venv / "bin" / "python").exists():
        build(args.venv, args.requirement)
    figures: dict[str, object] = {
        "venv": str(args.venv),
        "cpus": os.cpu_count(),
        "cpu_model": platform.processor() or platform.machine(),
        "load_before": os.getloadavg(),
    }
    one, _ = sha256_limit(2.0, workers=1)
    cores = os.cpu_count() or 1
    allc, _ = sha256_limit(2.0, workers=cores)
    figures["sha256_limit_one_core_GBps"] = round(one / 1e9, 3)
    figures["sha256_limit_all_cores_GBps"] = round(allc / 1e9, 3)
    print(f"sha256 limit: {one / 1e9:.2f} GB/s one core, {allc / 1e9:.2f} GB/s on {cores} cores")

    interp = probe(str(args.venv))
    if drop_caches():
        seconds, env = timed_check(interp, "full")
        size = sum(d.size_bytes for d in env.distributions)
        figures["full_cold_s"] = round(seconds, 2)
        figures["full_cold_GBps"] = round(size / seconds / 1e9, 3)
        print(f"full check, cold cache: {seconds:.2f} s, {size / seconds / 1e9:.2f} GB/s")
    else:
        print("full check, cold cache: not measured (cannot drop caches without root)")
    full = []
    for _ in range(args.repeat):
        seconds, env = timed_check(interp, "full")
        full.append(seconds)
    size = sum(d.size_bytes for d in env.distributions)
    files = sum(d.files for d in env.distributions)
    med = statistics.median(full)
    largest = max(
        (os.stat(p).st_size, p)
        for site in interp.site_packages
        for p in (os.path.join(t, f) for t, _, fs in os.walk(site) for f in fs)
        if os.path.isfile(p)
    )
    bound = max(size / allc, largest[0] / one)
    figures["largest_file"] = [largest[1], largest[0]]
    figures["bound_s"] = round(bound, 2)
    print(
        f"largest file {largest[0] / 1e9:.2f} GB ({os.path.basename(largest[1])}); lower bound "
        f"max(all bytes / all cores, largest / one core) = {bound:.2f} s"
    )
    figures.update(
        files=files,
        bytes=size,
        distributions=len(env.distributions),
        full_warm_s=[round(s, 2) for s in full],
        full_warm_median_s=round(med, 2),
        full_warm_GBps=round(size / med / 1e9, 3),
        fraction_of_limit=round(size / med / allc, 2),
    )
    print(
        f"full check, warm cache: {files} files, {size / 1e9:.2f} GB, median {med:.2f} s "
        f"of {[round(s, 2) for s in full]}: {size / med / 1e9:.2f} GB/s "
        f"({size / med / allc:.0%} of the all-core sha256 limit)"
    )
    sweep = {}
    for entry in [x for x in args.sweep.split(",") if x]:
        hashing.ENGINE = {"t": "threads", "p": "processes"}[entry[0]]
        hashing.DEFAULT_WORKERS = int(entry[1:])
        runs = sorted(timed_check(interp, "full")[0] for _ in range(args.repeat))
        sweep[entry] = round(size / statistics.median(runs) / 1e9, 3)
        print(f"  {hashing.ENGINE} x{hashing.DEFAULT_WORKERS}: {sweep[entry]:.2f} GB/s", flush=True)
    hashing.ENGINE, hashing.DEFAULT_WORKERS = "auto", None
    figures["sweep_GBps"] = sweep
    if args.cold_read and drop_caches():
        every = [
            (os.path.join(t, f), 0)
            for site in interp.site_packages
            for t, _, fs in os.walk(site)
            for f in fs
            if os.path.isfile(os.path.join(t, f))
        ]
        seconds = cold_read(every)
        figures["cold_read_s"] = round(seconds, 2)
        figures["cold_read_GBps"] = round(size / seconds / 1e9, 3)
        print(f"cold read, no hashing: {seconds:.2f} s, {size / seconds / 1e9:.2f} GB/s")
    quick = [timed_check(interp, "quick")[0] for _ in range(args.repeat)]
    figures["quick_s"] = [round(s, 2) for s in quick]
    figures["quick_median_s"] = round(statistics.median(quick), 2)
    print(f"quick check: median {statistics.median(quick):.2f} s of {figures['quick_s']}")
    pairs = Counter(" & ".join(o.owners) for o in env.overlaps)
    winners = Counter(" & ".join(o.matches) or "neither" for o in env.overlaps)
    figures["overlaps"] = len(env.overlaps)
    figures["overlaps_by_owners"] = dict(pairs)
    figures["overlaps_on_disk"] = dict(winners)
    print(f"overlapping paths: {len(env.overlaps)} {dict(pairs)}; on disk: {dict(winners)}")
    modified = {d.name: [m.path for m in d.modified] for d in env.distributions if d.modified}
    figures["modified"] = modified
    print(f"modified since install (as shipped): {modified}")
    figures["load_after"] = os.getloadavg()
    print(f"load average before {figures['load_before']}, after {figures['load_after']}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
