"""How fast `envbuild snapshot` checks a big venv against its RECORDs, next to the machine's
sha256 limit measured in the same run.

    python3 bench/integrity.py                    # builds /var/tmp/envbuild-bench/vllm-venv once
    python3 bench/integrity.py --venv /opt/torch/.venv --repeat 5 --json out.json
    python3 bench/integrity.py --baseline SRC     # SRC: git archive REV envbuild | tar -x -C SRC

Builds (or reuses) a vLLM 0.33 venv with uv, then measures:
* the full integrity check (every recorded file hashed), warm, in rounds: each round measures the
  sha256 limit first (hashlib over in-memory buffers, one thread per core, then one thread), then
  the check in a fresh Python (as `envbuild snapshot` runs it; interpreter start and the venv
  probe not timed), and with ``--baseline`` the same check by another checkout of envbuild,
  in rotating order. Each round gives the lower bound max(all bytes / all-core limit, largest
  file / one-core limit) and the check's time against it; medians are reported. Both sides
  must produce the same manifest;
* the full check from a cold page cache when caches can be dropped (root);
* the same recorded files hashed by ``xargs -P<cores> openssl dgst -sha256`` (the C library
  hashlib uses, one process per core): what a real tool reaches on the same bytes;
* the quick check (sizes; hashes only files newer than their install): median time;
* the paths owned by two distributions, by owner pair.
Load average is printed: the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from envbuild.installed import hashing
from envbuild.installed.hashing import sha256_limit
from envbuild.proc import core as proc
from envbuild.snapshot.distinfo import find_dists
from envbuild.snapshot.model.pyenv import PythonEnv
from envbuild.snapshot.pyenv import Interpreter, probe, scan_site_packages
from envbuild.snapshot.records import Mode

DEFAULT_VENV = Path("/var/tmp/envbuild-bench/vllm-venv")
REPO = Path(__file__).resolve().parent.parent


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


CHECK = """
import hashlib, json, sys, time
import envbuild
from envbuild.snapshot.pyenv import probe, scan_site_packages
interp = probe(sys.argv[1])
t0 = time.perf_counter()
env = scan_site_packages(interp, sys.argv[2])
seconds = time.perf_counter() - t0
print(json.dumps({"s": seconds, "bytes": sum(d.size_bytes for d in env.distributions),
                  "manifest": hashlib.sha256(env.model_dump_json().encode()).hexdigest()}))
"""


def child_check(source: Path, venv: Path, mode: Mode) -> dict[str, Any]:
    """One check in a fresh Python importing envbuild from ``source``. It runs in ``source``:
    ``python -c`` puts its working directory before PYTHONPATH, so run from this checkout it
    would import this checkout's envbuild whatever ``source`` says."""
    source = source.resolve()
    path = os.pathsep.join(x for x in (str(source), os.environ.get("PYTHONPATH")) if x)
    env = dict(os.environ, PYTHONPATH=path)
    done = subprocess.run(
        [sys.executable, "-c", CHECK + f"assert envbuild.__file__.startswith({str(source)!r})\n",
         str(venv), mode],
        env=env, capture_output=True, text=True, check=True, cwd=source,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def openssl_peer(interp: Interpreter, cores: int) -> float | None:
    """Seconds for ``xargs -P<cores> openssl dgst -sha256`` to hash the same recorded files
    (OpenSSL's sha256 is what hashlib runs): a real tool's figure on the same bytes. Each
    openssl gets one big file and a share of the small ones, so the cores stay balanced."""
    if shutil.which("openssl") is None:
        return None
    sizes = {
        e.abs: e.size or 0 for d in find_dists("bench", interp.site_packages) for e in d.entries()
    }
    paths = [p for p in sizes if os.path.isfile(p)]
    big = sorted((p for p in paths if sizes[p] >= hashing.BIG), key=lambda p: -sizes[p])
    small = [p for p in paths if sizes[p] < hashing.BIG]
    chunks = max(len(big), 4 * cores)
    share = -(-len(small) // chunks)
    order: list[str] = []
    for i in range(chunks):
        order += big[i : i + 1] + small[i * share : (i + 1) * share]
    with tempfile.NamedTemporaryFile() as listing:
        listing.write(b"".join(os.fsencode(p) + b"\0" for p in order))
        listing.flush()
        start = time.perf_counter()
        subprocess.run(
            f"xargs -0 -P{cores} -n {share + 1} openssl dgst -sha256 -r < {listing.name}",
            shell=True, check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        return time.perf_counter() - start


def cli_seconds(venv: Path, *argv: str) -> float:
    """One whole ``envbuild`` process, as a user waits for it (start-up included)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO), env.get("PYTHONPATH")) if x)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "envbuild", *argv], env=env, capture_output=True, check=False
    )
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 1):  # 1: verify found drift, still a whole run
        raise SystemExit(f"envbuild {' '.join(argv)}: exit {done.returncode}\n{done.stderr!r}")
    return seconds


def timed_check(interp: Interpreter, mode: Mode) -> tuple[float, PythonEnv]:
    start = time.perf_counter()
    env = scan_site_packages(interp, mode)
    return time.perf_counter() - start, env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    ap.add_argument("--requirement", default="vllm==0.33.0")
    ap.add_argument("--repeat", type=int, default=5, help="rounds of the warm full check")
    ap.add_argument("--baseline", type=Path, help="another envbuild source tree to compare")
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
    cores = os.cpu_count() or 1
    interp = probe(str(args.venv))
    largest = max(
        (os.stat(p).st_size, p)
        for site in interp.site_packages
        for p in (os.path.join(t, f) for t, _, fs in os.walk(site) for f in fs)
        if os.path.isfile(p)
    )
    figures["largest_file"] = [largest[1], largest[0]]
    if drop_caches():
        got = child_check(REPO, args.venv, "full")
        figures["full_cold_s"] = round(got["s"], 2)
        figures["full_cold_GBps"] = round(got["bytes"] / got["s"] / 1e9, 3)
        print(f"full check, cold cache: {got['s']:.2f} s, {got['bytes'] / got['s'] / 1e9:.2f} GB/s")
    else:
        print("full check, cold cache: not measured (cannot drop caches without root)")
    sides = {"envbuild": REPO, **({"baseline": args.baseline} if args.baseline else {})}
    rounds: list[dict[str, Any]] = []
    manifests: set[str] = set()
    for i in range(args.repeat):
        allc, _ = sha256_limit(1.5, workers=cores)
        one, _ = sha256_limit(1.0, workers=1)
        row: dict[str, Any] = {"all_core_GBps": allc / 1e9, "one_core_GBps": one / 1e9}
        names = list(sides) if i % 2 == 0 else list(sides)[::-1]
        for name in names:
            got = child_check(sides[name], args.venv, "full")
            row[name] = got["s"]
            manifests.add(got["manifest"])
            size = got["bytes"]
        row["bound_s"] = max(size / allc, largest[0] / one)
        row["load"] = os.getloadavg()[0]
        rounds.append(row)
        print(
            f"round {i + 1}: limit {allc / 1e9:.2f} GB/s on {cores} cores, {one / 1e9:.2f} on "
            f"one; bound {row['bound_s']:.2f} s; "
            + ", ".join(f"{n} {row[n]:.2f} s ({row['bound_s'] / row[n]:.0%})" for n in names)
            + f"; load {row['load']:.1f}",
            flush=True,
        )
    if len(manifests) != 1:
        raise SystemExit("the sides found different manifests")
    env = timed_check(interp, "full")[1]
    size = sum(d.size_bytes for d in env.distributions)
    files = sum(d.files for d in env.distributions)
    figures.update(
        files=files,
        bytes=size,
        distributions=len(env.distributions),
        rounds=rounds,
        sha256_limit_one_core_GBps=round(statistics.median(r["one_core_GBps"] for r in rounds), 3),
        sha256_limit_all_cores_GBps=round(statistics.median(r["all_core_GBps"] for r in rounds), 3),
        bound_s=round(statistics.median(r["bound_s"] for r in rounds), 2),
    )
    for name in sides:
        med = statistics.median(r[name] for r in rounds)
        frac = statistics.median(r["bound_s"] / r[name] for r in rounds)
        figures[f"{name}_full_warm_s"] = [round(r[name], 2) for r in rounds]
        figures[f"{name}_full_warm_median_s"] = round(med, 2)
        figures[f"{name}_full_warm_GBps"] = round(size / med / 1e9, 3)
        figures[f"{name}_fraction_of_bound"] = round(frac, 2)
        print(
            f"{name}: full check, warm: {files} files, {size / 1e9:.2f} GB, median {med:.2f} s "
            f"of {figures[f'{name}_full_warm_s']}: {size / med / 1e9:.2f} GB/s; median of "
            f"bound / time per round: {frac:.0%}"
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
    peer = [openssl_peer(interp, cores) for _ in range(args.repeat)]
    if peer and None not in peer:
        med = statistics.median(t for t in peer if t is not None)
        figures["openssl_xargs_s"] = [round(t, 2) for t in peer if t is not None]
        figures["openssl_xargs_median_s"] = round(med, 2)
        print(
            f"peer: xargs -P{cores} openssl dgst -sha256 over the same files: median {med:.2f} s "
            f"({size / med / 1e9:.2f} GB/s)",
            flush=True,
        )
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
    quick: dict[str, list[float]] = {name: [] for name in sides}
    for i in range(args.repeat):
        for name in list(sides) if i % 2 == 0 else list(sides)[::-1]:
            quick[name].append(child_check(sides[name], args.venv, "quick")["s"])
    for name, times in quick.items():
        key = "quick" if name == "envbuild" else f"{name}_quick"
        figures[f"{key}_s"] = [round(s, 2) for s in times]
        figures[f"{key}_median_s"] = round(statistics.median(times), 2)
        print(
            f"{name}: quick check: median {statistics.median(times):.2f} s of {figures[f'{key}_s']}"
        )
    # whole processes: the start-up a user waits through is part of "one or two seconds"
    with tempfile.TemporaryDirectory(prefix="envbuild-bench-") as tmp:
        manifest = str(Path(tmp) / "snapshot.json")
        common = ("--python", str(args.venv), "--no-models", "--no-docker", "--no-systemd")
        cli_seconds(args.venv, "snapshot", *common, "-o", manifest)  # warm the page cache
        commands = {
            "cli_snapshot_full": ("snapshot", *common, "-o", manifest),
            "cli_snapshot_quick": ("snapshot", *common, "--quick", "-o", manifest + ".q"),
            "cli_verify_quick": ("verify", manifest, "--python", str(args.venv), "--quick"),
            "cli_version": ("--version",),
        }
        for key, argv in commands.items():
            took = [cli_seconds(args.venv, *argv) for _ in range(args.repeat)]
            figures[f"{key}_s"] = [round(t, 2) for t in took]
            figures[f"{key}_median_s"] = round(statistics.median(took), 2)
            med = statistics.median(took)
            print(f"whole process ({key}): median {med:.2f} s of {figures[f'{key}_s']}", flush=True)
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
