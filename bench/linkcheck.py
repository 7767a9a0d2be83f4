"""How fast the link check covers a big environment, cold and from its cache, beside `ldd`.

    python3 bench/linkcheck.py                      # the kimi-nvfp4 venv, made once with uv
    python3 bench/linkcheck.py --venv DIR --repeat 5 --json out.json

Makes (or reuses) a venv of ``lockfiles/pylock.kimi-nvfp4.toml`` with ``uv pip install -r``
(~9 GB), then measures, each in a fresh Python (interpreter start not timed, the import of
envbuild.linkcheck timed), in rounds:

* cold: an empty link-check cache (every candidate file hashed and its ELF tables read);
* warm: the same cache (a stat per file, then the cached facts);
* the sha256 of the same ELF files alone (``hashing.hash_files``): the part of cold that is
  the cache key's price;
* ``ldd`` on every ELF file the check read, one process per file, sequential and
  ``xargs -P<cores>``: the peer (it resolves libraries only, not torch's symbols).

The page cache is warm for every figure (the venv was read before). Medians of ``--repeat``;
wall and CPU (user+sys) seconds; the load average is printed (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / (
    "envbuild-tests/kimi-nvfp4"
)

CHECK = """
import json, os, resource, sys, time
t0 = time.perf_counter(); r0 = resource.getrusage(resource.RUSAGE_SELF)
from envbuild import linkcheck
report = linkcheck.check_folder("/", sys.argv[1])
wall = time.perf_counter() - t0
r1 = resource.getrusage(resource.RUSAGE_SELF); c = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime + c.ru_utime + c.ru_stime
print(json.dumps({"wall": wall, "cpu": cpu, "checked": report.checked,
  "findings": [f.id for f in report.findings], "optional": len(report.optional),
  "hits": report.cache_hits, "misses": report.cache_misses}))
"""

HASH = """
import json, os, resource, sys, time
from envbuild.installed import hashing
paths = json.load(open(sys.argv[1]))
t0 = time.perf_counter(); r0 = resource.getrusage(resource.RUSAGE_SELF)
got = hashing.hash_files([(p, os.path.getsize(p)) for p in paths])
wall = time.perf_counter() - t0
r1 = resource.getrusage(resource.RUSAGE_SELF); c = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime + c.ru_utime + c.ru_stime
print(json.dumps({"wall": wall, "cpu": cpu, "bytes": sum(f.size for f in got.values())}))
"""


def make_venv(venv: Path) -> None:
    if (venv / "bin" / "python").exists():
        return
    sys.path.insert(0, str(REPO))
    from envbuild.proc import core as proc

    uv = proc.find_uv()
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    lock = REPO / "lockfiles" / "pylock.kimi-nvfp4.toml"  # a PEP 751 name: uv reads it as is
    subprocess.run([uv, "venv", "-q", "-p", "3.11", str(venv)], check=True, env=env)
    subprocess.run(
        [uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), "-r", str(lock)],
        check=True,
        env=env,
    )


def run(code: str, *args: str, cache: str) -> dict[str, Any]:
    env = {**os.environ, "XDG_CACHE_HOME": cache, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", code, *args], check=True, capture_output=True, text=True, env=env
    )
    return dict(json.loads(out.stdout.splitlines()[-1]))


def elf_files(venv: Path, cache: str) -> list[str]:
    code = (
        "import json, sys; from envbuild import linkcheck; from envbuild.linkcheck import "
        "_candidates; from envbuild.linkcheck.reader import Cache, read_all\n"
        "files, _ = _candidates('/', sys.argv[1])\n"
        "got = read_all({e: (h, None) for e, h in files.items()}, cache=Cache(None))\n"
        "print(json.dumps(sorted(files[e] for e in got.elf)))"
    )
    env = {**os.environ, "XDG_CACHE_HOME": cache, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code, str(venv)], check=True, capture_output=True,
                         text=True, env=env)  # fmt: skip
    return list(json.loads(out.stdout))


def timed(argv: list[str], **kw: Any) -> tuple[float, float]:
    t0 = time.perf_counter()
    r0 = os.times()
    subprocess.run(argv, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
    r1 = os.times()
    return time.perf_counter() - t0, (r1.children_user - r0.children_user) + (
        r1.children_system - r0.children_system
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--venv", type=Path, default=DEFAULT)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    make_venv(args.venv)
    cores = os.cpu_count() or 1
    rows: dict[str, list[tuple[float, float]]] = {}
    facts: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        paths = elf_files(args.venv, scratch)
        listed = Path(scratch) / "elf.json"
        listed.write_text(json.dumps(paths))
        facts["elf_files"] = len(paths)
        facts["elf_bytes"] = sum(os.path.getsize(p) for p in paths)
        for i in range(args.repeat):
            cache = tempfile.mkdtemp(dir=scratch)
            cold = run(CHECK, str(args.venv), cache=cache)
            warm = run(CHECK, str(args.venv), cache=cache)
            assert cold["findings"] == warm["findings"] and warm["misses"] == 0, (cold, warm)
            facts["findings"], facts["optional"] = cold["findings"], cold["optional"]
            rows.setdefault("cold", []).append((cold["wall"], cold["cpu"]))
            rows.setdefault("warm", []).append((warm["wall"], warm["cpu"]))
            h = run(HASH, str(listed), cache=cache)
            rows.setdefault("sha256 of the ELF files", []).append((h["wall"], h["cpu"]))
            rows.setdefault("ldd per file, sequential", []).append(
                timed(["xargs", "-0", "-n1", "ldd"], input=b"\0".join(p.encode() for p in paths))
            )
            rows.setdefault(f"ldd per file, xargs -P{cores}", []).append(
                timed(
                    ["xargs", "-0", "-n1", f"-P{cores}", "ldd"],
                    input=b"\0".join(p.encode() for p in paths),
                )
            )
            print(f"round {i + 1}: load {os.getloadavg()[0]:.1f}", file=sys.stderr)
    result = {
        "venv": str(args.venv),
        "cores": cores,
        "load_average": os.getloadavg(),
        **facts,
        "rows": {
            k: {
                "wall_s": statistics.median(w for w, _ in v),
                "cpu_s": statistics.median(c for _, c in v),
            }
            for k, v in rows.items()
        },
    }
    print(f"{facts['elf_files']} ELF files, {facts['elf_bytes'] / 1e9:.2f} GB; findings: "
          f"{facts['findings']} (+{facts['optional']} in plugins)")  # fmt: skip
    print("| | wall (s) | CPU (s) |\n|---|---:|---:|")
    for k, v in result["rows"].items():
        print(f"| {k} | {v['wall_s']:.2f} | {v['cpu_s']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
