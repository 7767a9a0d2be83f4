"""Packing throughput: envbuild's layer writer against plain ``tar | zstd -T0`` and ``tar | pigz``.

    python3 bench/layers.py [--pairs 7] [--baseline SRC] [--gnu-tar] [--json FILE] DIR [DIR ...]

For each tree (default: this Python's site-packages) and each compressor, runs rounds of:
* the reference, ``tar -C DIR -cf - . | zstd -3 -T0 -q -c > out`` (``pigz -6 -n`` for gzip): plain
  GNU tar, unsorted, no hashing at all — the pipeline the target is stated against;
* the same pipeline with both sha256s envbuild computes (``tee`` into ``sha256sum`` on the tar
  and on the compressed stream): what the two digests cost a shell pipeline;
* envbuild: ``layers.write_layer`` of ``entries.tree_entries``, as the build packs (sorted,
  normalized GNU tar, diff_id and digest, written
  into a fresh store with fsync), in a child Python that times itself (no interpreter start);
* with ``--baseline SRC``: the same from another checkout of envbuild (``git archive REV
  envbuild | tar -x -C SRC``), whose digests must be the same bytes;
* with ``--gnu-tar``: GNU tar writing the sorted, normalized tar (``--sort=name --mtime=@0
  --owner=0 --group=0 --numeric-owner --format=gnu --mode=a=rX,u+w``) read by Python, which
  hashes it and feeds zstd: the "well-kept tool" alternative (other bytes: tar sorts per
  directory, so its order differs from the bytewise path order the layers promise).
The order of the runs rotates every round; each round gives a ratio (reference time / envbuild
time), and the table shows medians: the machine may be shared, so the load average is printed.
MB/s are uncompressed tar bytes per second of wall time; CPU s = user + system of all processes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

REFERENCE = {
    "zstd": "tar -C {src} -cf - . | zstd -3 -T0 -q -c > {out}",
    "gzip": "tar -C {src} -cf - . | pigz -6 -n -c > {out}",
}
HASHED = {
    "zstd": "tar -C {src} -cf - . | tee >(sha256sum >{out}.d) | zstd -3 -T0 -q -c "
    "| tee >(sha256sum >{out}.c) > {out}",
    "gzip": "tar -C {src} -cf - . | tee >(sha256sum >{out}.d) | pigz -6 -n -c "
    "| tee >(sha256sum >{out}.c) > {out}",
}

# Runs in a child Python with PYTHONPATH set to the envbuild source under test.
PACK = """
import json, resource, shutil, sys, time
from pathlib import Path
from envbuild.build.entries import tree_entries
from envbuild.build.layers import Compression, write_layer
from envbuild.store.core import Store
src, store, compression = sys.argv[1:4]
shutil.rmtree(store, ignore_errors=True)
def cpu():
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
def own():
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime
c0, o0, t0 = cpu(), own(), time.perf_counter()
entries = tree_entries(Path(src), prefix="opt/venv")
layer = write_layer(Store(store), entries, compression=Compression(compression), mtime=0)
print(json.dumps({"s": time.perf_counter() - t0, "cpu": cpu() - c0, "own": own() - o0,
                  "size": layer.uncompressed_size,
                  "digest": layer.digest, "diff_id": layer.diff_id, "files": layer.files}))
"""

GNU_TAR = """
import hashlib, json, os, resource, subprocess, sys, threading, time
src, out, compression = sys.argv[1:4]
def cpu():
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
c0, t0 = cpu(), time.perf_counter()
tar = subprocess.Popen(["tar", "-C", src, "--sort=name", "--mtime=@0", "--owner=0", "--group=0",
    "--numeric-owner", "--format=gnu", "--mode=a=rX,u+w", "-cf", "-", "."], stdout=subprocess.PIPE)
argv = ["zstd", "-3", "-T0", "-q", "-c"] if compression == "zstd" else ["pigz", "-6", "-n", "-c"]
z = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
diff, digest, size = hashlib.sha256(), hashlib.sha256(), 0
def pump():
    with open(out, "wb") as f:
        while data := os.read(z.stdout.fileno(), 1 << 20):
            digest.update(data)
            f.write(data)
        os.fsync(f.fileno())
reader = threading.Thread(target=pump)
reader.start()
while data := os.read(tar.stdout.fileno(), 1 << 20):
    diff.update(data)
    size += len(data)
    view = memoryview(data)
    while view:
        view = view[os.write(z.stdin.fileno(), view):]
z.stdin.close()
tar.wait(); reader.join(); z.wait()
print(json.dumps({"s": time.perf_counter() - t0, "cpu": cpu() - c0, "size": size,
                  "diff_id": "sha256:" + diff.hexdigest()}))
"""


def children_cpu() -> float:
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return kids.ru_utime + kids.ru_stime


def shell(cmd: str) -> tuple[float, float]:
    c0, t0 = children_cpu(), time.perf_counter()
    subprocess.run(["bash", "-o", "pipefail", "-c", cmd], check=True)
    return time.perf_counter() - t0, children_cpu() - c0


def child(code: str, pythonpath: Path, *args: str) -> dict[str, Any]:
    path = os.pathsep.join(x for x in (str(pythonpath), os.environ.get("PYTHONPATH")) if x)
    env = dict(os.environ, PYTHONPATH=path)  # the source under test first, then what was there
    done = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, check=True
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def tree_stats(src: Path) -> tuple[int, int]:
    """(tar bytes, files) of plain GNU tar over the tree; also reads it into the page cache."""
    done = subprocess.run(
        f"tar -C {shlex.quote(str(src))} -cf - . | wc -c",
        shell=True,
        capture_output=True,
        text=True,
        check=True,
    )
    files = sum(len(f) for _, _, f in os.walk(src))
    return int(done.stdout), files


def bench_tree(
    src: Path, compression: str, pairs: int, work: Path, baseline: Path | None, gnu_tar: bool
) -> dict[str, Any]:
    size, files = tree_stats(src)
    q = shlex.quote(str(src))
    out = work / "ref.out"
    runs: dict[str, list[tuple[float, float]]] = {"reference": [], "hashed": [], "envbuild": []}
    if baseline is not None:
        runs["baseline"] = []
    if gnu_tar:
        runs["gnu_tar"] = []
    digests: dict[str, set[str]] = {"envbuild": set(), "baseline": set(), "gnu_tar": set()}
    sizes: dict[str, int] = {}
    own: dict[str, list[float]] = {"envbuild": [], "baseline": []}  # Python's CPU, no zstd

    def one(name: str) -> tuple[float, float]:
        if name == "reference":
            return shell(REFERENCE[compression].format(src=q, out=out))
        if name == "hashed":
            return shell(HASHED[compression].format(src=q, out=out))
        if name == "gnu_tar":
            got = child(GNU_TAR, REPO, str(src), str(out), compression)
        else:
            root = REPO if name == "envbuild" else baseline
            assert root is not None
            got = child(PACK, root, str(src), str(work / f"store-{name}"), compression)
            digests[name].add(got["digest"])
            own[name].append(float(got["own"]))
        digests[name].add(got["diff_id"])
        sizes[name] = got["size"]
        return float(got["s"]), float(got["cpu"])

    names = list(runs)
    load_before = os.getloadavg()
    for i in range(pairs):
        order = names[i % len(names) :] + names[: i % len(names)]  # rotate who goes first
        for name in order:
            runs[name].append(one(name))
        ratio = runs["reference"][-1][0] / runs["envbuild"][-1][0]
        print(
            f"  {src.name} {compression} round {i + 1}: "
            + ", ".join(f"{n} {runs[n][-1][0]:.2f} s" for n in names)
            + f"; reference/envbuild {ratio:.0%}; load {os.getloadavg()[0]:.1f}",
            file=sys.stderr,
            flush=True,
        )
    if baseline is not None and digests["baseline"] != digests["envbuild"]:
        raise SystemExit(f"baseline and envbuild packed different bytes: {digests}")
    med = {n: statistics.median(t for t, _ in r) for n, r in runs.items()}
    cpu = {n: statistics.median(c for _, c in r) for n, r in runs.items()}
    ratios = {
        n: [ref[0] / mine[0] for ref, mine in zip(runs["reference"], runs[n], strict=True)]
        for n in names
        if n != "reference"
    }
    return {
        "tree": str(src),
        "compression": compression,
        "tar_bytes": size,
        "envbuild_bytes": sizes["envbuild"],
        "files": files,
        "pairs": pairs,
        "median_s": med,
        "median_MBps": {n: (sizes.get(n, size)) / s / 1e6 for n, s in med.items()},
        "median_cpu_s": cpu,
        "median_python_cpu_s": {n: statistics.median(v) for n, v in own.items() if v},
        "ratio_median": {n: statistics.median(r) for n, r in ratios.items()},
        "ratio_range": {n: [min(r), max(r)] for n, r in ratios.items()},
        "gnu_tar_same_bytes": digests["gnu_tar"] <= digests["envbuild"] if gnu_tar else None,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "runs": runs,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("trees", nargs="*", type=Path)
    ap.add_argument("--pairs", type=int, default=7, help="rounds per tree and compressor")
    ap.add_argument("--compression", default="zstd,gzip")
    ap.add_argument("--baseline", type=Path, help="another envbuild source tree to compare")
    ap.add_argument("--gnu-tar", action="store_true", help="also time GNU tar + Python hashing")
    ap.add_argument("--json", type=Path, help="write every figure here too")
    args = ap.parse_args()
    trees = args.trees or [Path(sysconfig.get_paths()["purelib"])]
    results = []
    print(
        "| tree | MB | files | compression | reference MB/s (CPU s) | + 2 x sha256sum MB/s "
        "(CPU s) | envbuild MB/s (CPU s; of which Python) | envbuild / reference, median of "
        "rounds (range) |"
        + (" baseline MB/s (ratio; Python CPU s) |" if args.baseline else "")
        + (" GNU tar + Python MB/s (ratio) |" if args.gnu_tar else "")
    )
    extra = "---:|" * (bool(args.baseline) + args.gnu_tar)
    print("|---|---:|---:|---|---:|---:|---:|---:|" + extra)
    with tempfile.TemporaryDirectory(prefix="bench-layers-", dir="/var/tmp") as tmp:
        for src in trees:
            for compression in args.compression.split(","):
                r = bench_tree(
                    src.resolve(), compression, args.pairs, Path(tmp), args.baseline, args.gnu_tar
                )
                results.append(r)
                mbps, cpu, ratio, rng = (
                    r["median_MBps"],
                    r["median_cpu_s"],
                    r["ratio_median"],
                    r["ratio_range"],
                )
                row = (
                    f"| {src} | {r['tar_bytes'] / 1e6:.0f} | {r['files']:,} | {compression} "
                    f"| {mbps['reference']:.0f} ({cpu['reference']:.1f}) "
                    f"| {mbps['hashed']:.0f} ({cpu['hashed']:.1f}) "
                    f"| {mbps['envbuild']:.0f} ({cpu['envbuild']:.1f}; Python "
                    f"{r['median_python_cpu_s']['envbuild']:.2f}) "
                    f"| **{ratio['envbuild']:.0%}** ({rng['envbuild'][0]:.0%}-"
                    f"{rng['envbuild'][1]:.0%}) |"
                )
                if args.baseline:
                    row += (
                        f" {mbps['baseline']:.0f} ({ratio['baseline']:.0%}; Python "
                        f"{r['median_python_cpu_s']['baseline']:.2f}) |"
                    )
                if args.gnu_tar:
                    row += f" {mbps['gnu_tar']:.0f} ({ratio['gnu_tar']:.0%}) |"
                print(row, flush=True)
                if args.json:
                    args.json.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
