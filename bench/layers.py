"""Packing throughput: envbuild's layer writer against plain ``tar | zstd -T0`` and ``tar | pigz``.

    python bench/layers.py DIR [DIR ...]     (default: this Python's site-packages)

Packs each tree with GNU tar piped into the compressor (the reference) and with
``envbuild.layers.layer_from_tree`` (sorted, normalized, hashed twice, written to a store), for zstd
and gzip, after one warm-up read so both run from the page cache; each side is timed
``--repeat`` times (default 3), interleaved, and the best run counts (the machine may be shared).
Prints a Markdown table of MB/s (uncompressed tar bytes per second) and the ratio.
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from envbuild.layers import Compression, layer_from_tree
from envbuild.store import Store

REFERENCE = {
    Compression.ZSTD: "tar -C {src} -cf - . | zstd -3 -T0 -q -c > {out}",
    Compression.GZIP: "tar -C {src} -cf - . | pigz -6 -n -c > {out}",
}


def warm(src: Path) -> int:
    done = subprocess.run(
        f"tar -C {src} -cf - . | wc -c", shell=True, capture_output=True, text=True, check=True
    )
    return int(done.stdout)


def cpu() -> float:
    """CPU seconds (user + system) of this process and its finished children."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def reference(src: Path, compression: Compression, out: Path) -> tuple[float, float]:
    start, cpu0 = time.perf_counter(), cpu()
    subprocess.run(REFERENCE[compression].format(src=src, out=out), shell=True, check=True)
    return time.perf_counter() - start, cpu() - cpu0


def ours(src: Path, compression: Compression, store_dir: Path) -> tuple[float, float, int]:
    shutil.rmtree(store_dir, ignore_errors=True)
    start, cpu0 = time.perf_counter(), cpu()
    layer = layer_from_tree(Store(store_dir), src, prefix="opt/venv", compression=compression)
    return time.perf_counter() - start, cpu() - cpu0, layer.uncompressed_size


def main(argv: list[str]) -> None:
    repeat = 3
    if argv[:1] == ["--repeat"]:
        repeat, argv = int(argv[1]), argv[2:]
    trees = [Path(a) for a in argv] or [Path(sysconfig.get_paths()["purelib"])]
    print(
        "| tree | MB | compression | tar + compressor MB/s (CPU s) | envbuild MB/s (CPU s) "
        "| ratio |"
    )
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="bench-layers-") as tmp:
        for src in trees:
            size = warm(src)
            for compression in (Compression.ZSTD, Compression.GZIP):
                ref_s = our_s = ref_cpu = our_cpu = float("inf")
                our_size = 0
                for _ in range(repeat):
                    wall, used = reference(src, compression, Path(tmp) / "ref.out")
                    ref_s, ref_cpu = min(ref_s, wall), min(ref_cpu, used)
                    wall, used, our_size = ours(src, compression, Path(tmp) / "store")
                    our_s, our_cpu = min(our_s, wall), min(our_cpu, used)
                ref_rate, our_rate = size / ref_s / 1e6, our_size / our_s / 1e6
                print(
                    f"| {src} | {size / 1e6:.0f} | {compression.value} | {ref_rate:.0f} "
                    f"({ref_cpu:.1f}) | {our_rate:.0f} ({our_cpu:.1f}) "
                    f"| {our_rate / ref_rate:.0%} |"
                )


if __name__ == "__main__":
    main(sys.argv[1:])
