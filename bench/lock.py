"""How long `envbuild lock` takes for the seed specs against PyPI, with a cold and a warm uv cache,
and how long `envbuild lock --check` takes (no resolution).

    python3 bench/lock.py                     # every spec under specs/
    python3 bench/lock.py specs/glm5-gguf.toml --repeat 5 --json out.json

Cold: a fresh, empty UV_CACHE_DIR for each spec (every index page and wheel METADATA is fetched;
for flash-attn the 8 MB sdist is downloaded to read its PKG-INFO). Warm: the same cache again
(median of --repeat). Locks are written to a temp dir and compared with the committed ones.
The numbers depend on the network to PyPI; load average is printed before and after.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from envbuild.lock.core import check_lock, lock_path, lock_spec
from envbuild.spec.validate import validate

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    specs = args.specs or sorted((REPO / "specs").glob("*.toml"))
    logging.basicConfig(level=logging.WARNING)
    print(f"load average before: {os.getloadavg()}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="envbuild-bench-lock-") as tmp:
        for spec in specs:
            loaded = validate(spec).loaded
            out = Path(tmp) / f"pylock.{loaded.name}.toml"
            cache = Path(tmp) / f"cache-{loaded.name}"
            os.environ["UV_CACHE_DIR"] = str(cache)
            start = time.perf_counter()
            result = lock_spec(loaded, output=out)
            cold = time.perf_counter() - start
            warm = []
            for _ in range(args.repeat):
                out.unlink()
                start = time.perf_counter()
                lock_spec(loaded, output=out)
                warm.append(time.perf_counter() - start)
            start = time.perf_counter()
            check_lock(loaded)
            check = time.perf_counter() - start
            committed = lock_path(loaded)
            same = committed.exists() and committed.read_bytes() == out.read_bytes()
            row = {
                "spec": loaded.name,
                "packages": len(result.lock.packages),
                "files": sum(len(p.files()) for p in result.lock.packages),
                "cold_s": round(cold, 2),
                "warm_s": round(statistics.median(warm), 2),
                "check_s": round(check, 3),
                "same_as_committed": same,
            }
            rows.append(row)
            print(json.dumps(row))
    print(f"load average after: {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
