"""How long apply takes to realise a generation from a committed lock, and to check one again.

For each spec (default: quickstart and kimi-k25-int4): *cold* = a new generation with an empty
uv cache (every wheel downloaded from PyPI); *warm* = a new generation in a new root with that
cache; *verify* = the full check a later apply runs before reusing it (every venv file hashed
against its RECORD). Run: ``python3 bench/apply.py [SPEC...]``; it prints a Markdown table row per
spec for bench/RESULTS.md.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from envbuild.apply.builder import find_reusable, realise
from envbuild.apply.generations import remove_tree
from envbuild.apply.inputs import from_spec
from envbuild.apply.paths import Paths

REPO = Path(__file__).resolve().parent.parent
DEFAULT = ["specs/quickstart.toml", "specs/kimi-k25-int4.toml"]


def du(path: Path) -> int:
    return sum(
        os.lstat(os.path.join(top, f)).st_size for top, _d, files in os.walk(path) for f in files
    )


def one(spec: str, work: Path) -> str:
    inp = from_spec(REPO / spec)
    os.environ["UV_CACHE_DIR"] = str(work / "uv-cache")
    times = {}
    for label in ("cold", "warm"):
        paths = Paths(work / f"root-{label}")
        start = time.perf_counter()
        gen = realise(paths, inp, {}).generation
        times[label] = time.perf_counter() - start
    start = time.perf_counter()
    found = find_reusable(paths, gen.meta.content_hash)
    times["verify"] = time.perf_counter() - start
    assert found.generation is not None and found.generation.number == gen.number
    files = sum(len(f) for _t, _d, f in os.walk(gen.venv))
    size = du(gen.venv)
    for label in ("cold", "warm"):
        remove_tree(work / f"root-{label}")
    shutil.rmtree(work / "uv-cache", ignore_errors=True)
    return (
        f"| {inp.name} | {len(gen.meta.packages)} | {files} | {size / 1e9:.2f} | "
        f"{times['cold']:.1f} | {times['warm']:.1f} | {times['verify']:.1f} |"
    )


def main(argv: list[str]) -> None:
    print("| spec | distributions | venv files | venv GB | cold (s) | warm (s) | verify (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for spec in argv or DEFAULT:
        with tempfile.TemporaryDirectory(prefix="envbuild-bench-apply-") as tmp:
            print(one(spec, Path(tmp)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
