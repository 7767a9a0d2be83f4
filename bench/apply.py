"""How long apply takes to realize a generation from a committed lock, and to check one again.

``python3 bench/apply.py --cli [A B]``: the whole ``envbuild apply`` process as a user runs it
(``/usr/bin/time``), A then B (the second experiment) in one root and store, B into a second
root sharing the store (the parser's verdict known), B again; each spec serves a
tiny model from a local hub instead of its placeholder revision, on fake GPUs (NVML only).

``python3 bench/apply.py --shared [--before DIR] [A B]`` instead (default kimi-k25-int4 then
minimax-m25-fp8, which share every distribution): plain ``uv pip sync`` of B, copying and
hard-linking, DIR's own ``realize`` of B (another checkout: today's generation), then
generation A and generation B in one state dir and one store, and the full check of B. Each
step gets an empty uv cache of its own (uv 0.13 downloads a pylock's wheels again on every sync,
so a shared cache only fills the disk); the new disk is the file system's free space before and
after, uv's cache included.

For each spec (default: quickstart and kimi-k25-int4): *cold* = a new generation with an empty
uv cache (every wheel downloaded from PyPI); *warm* = a new generation in a new root with that
cache; *verify* = the full check a later apply runs before reusing it (every venv file hashed
against its RECORD). Run: ``python3 bench/apply.py [SPEC...]``; it prints a Markdown table row per
spec for bench/RESULTS.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import wholeproc

from envbuild.apply.generations import remove_tree
from envbuild.apply.inputs import from_spec
from envbuild.apply.paths import Paths
from envbuild.apply.realize import find_reusable, realize

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
        gen = realize(paths, inp, {}).generation
        times[label] = time.perf_counter() - start
    start = time.perf_counter()
    found = find_reusable(paths, gen.meta.content_hash)
    times["verify"] = time.perf_counter() - start
    assert found.generation is not None and found.generation.number == gen.number
    # as users feel it: the check as a whole `envbuild generations --verify` process (start-up
    # and imports included), with the load average beside it
    whole = wholeproc.timed(
        ["generations", "--verify", "--root", str(paths.root)], {"this": REPO}, 3
    )
    times["verify_process"] = whole["this"]["wall"]
    print(f"{inp.name}: `envbuild generations --verify` as a whole process: median "
          f"{whole['this']['wall']:.2f} s wall, {whole['this']['cpu']:.2f} s CPU, load average "
          f"{whole['load_start']:.1f} to {whole['load_end']:.1f}", file=sys.stderr)  # fmt: skip
    files = sum(len(f) for _t, _d, f in os.walk(gen.venv))
    size = du(gen.venv)
    for label in ("cold", "warm"):
        remove_tree(work / f"root-{label}")
    shutil.rmtree(work / "uv-cache", ignore_errors=True)
    return (
        f"| {inp.name} | {len(gen.meta.packages)} | {files} | {size / 1e9:.2f} | "
        f"{times['cold']:.1f} | {times['warm']:.1f} | {times['verify']:.1f} | "
        f"{times['verify_process']:.1f} | {whole['load_start']:.1f} |"
    )


def free() -> int:
    st = os.statvfs(tempfile.gettempdir())
    return st.f_bavail * st.f_frsize


def timed(fn, work: Path, n: int):  # type: ignore[no-untyped-def]
    """Run ``fn`` with an empty uv cache of its own (uv downloads a pylock's URL wheels again
    on every sync anyway, so a shared cache would only fill the disk), removed after."""
    cache = work / f"uv-cache-{n}"
    os.environ["UV_CACHE_DIR"] = str(cache)
    before, start = free(), time.perf_counter()
    out = fn()
    took, used = time.perf_counter() - start, (before - free()) / 1e6
    shutil.rmtree(cache, ignore_errors=True)
    return out, took, used


def plain_install(venv: Path, lock: Path, mode: str, python: str) -> None:
    from envbuild.apply.venv import create_venv
    from envbuild.proc import core as proc

    create_venv(venv, python)
    run = proc.run(
        [proc.find_uv(), "pip", "sync", "--preview-features", "pylock", "--no-config",
         "--python", venv / "bin" / "python", "--require-hashes", "--no-build",
         "--no-index", "--strict", "--link-mode", mode, lock],
        tool="uv", env=proc.uv_env(), cwd=lock.parent, check=False,
    )  # fmt: skip
    if run.returncode:
        raise SystemExit(f"uv pip sync --link-mode {mode} failed:\n{run.stdout}\n{run.stderr}")


BEFORE = """
import sys, time
from pathlib import Path
try:
    from envbuild.apply.realize import realize
except ImportError:  # a checkout from before issue #27's renames
    from envbuild.apply.builder import realise as realize  # renames: keep
from envbuild.apply.inputs import from_spec
from envbuild.apply.paths import Paths
realize(Paths(sys.argv[2]), from_spec(sys.argv[1]), {})
"""


def before_install(tree: Path, spec: str, root: Path) -> None:
    """``realize`` of another checkout (``--before``: today's generation, for the same run)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", BEFORE, str(tree / spec), str(root)],
        check=False, env=env, capture_output=True, text=True, cwd=tree,
    )  # fmt: skip
    if done.returncode:
        raise SystemExit(f"--before realize failed:\n{done.stderr[-2000:]}")


def shared(a: str, b: str, work: Path, before: Path | None = None) -> None:
    from envbuild.apply.venv import INSTALL_LOCK, install_lock
    from envbuild.store.core import Store

    store = Store(work / "store")
    paths = Paths(work / "root")
    first, second = from_spec(REPO / a), from_spec(REPO / b)
    print("| what (each with an empty uv cache) | wall (s) | new disk (MB), uv cache included |")
    print("|---|---:|---:|")
    lock = work / "plain" / INSTALL_LOCK
    lock.parent.mkdir()
    lock.write_text(install_lock(second.lock, second.lock_text, {}))
    python = second.spec.python.version
    for n, mode in enumerate(("copy", "hardlink")):
        venv = work / "plain" / f"venv-{n}"
        _none, t, d = timed(lambda v=venv, m=mode: plain_install(v, lock, m, python), work, n)
        print(f"| plain `uv pip sync --link-mode {mode}` of {second.name} | {t:.1f} | {d:.0f} |",
              flush=True)  # fmt: skip
        shutil.rmtree(venv)  # the disk is not big enough for every copy at once
    if before is not None:
        rev = subprocess.run(["git", "-C", str(before), "rev-parse", "--short", "HEAD"],
                             check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
        _none, t, d = timed(lambda: before_install(before, b, work / "before-root"), work, 9)
        print(f"| today's generation of {second.name} ({rev}: copied, every file hashed) | "
              f"{t:.1f} | {d:.0f} |", flush=True)  # fmt: skip
        remove_tree(work / "before-root")
    gen_a, t, d = timed(lambda: realize(paths, first, {}, store=store).generation, work, 2)
    print(f"| first generation ({first.name}, its trees made) | {t:.1f} | {d:.0f} |", flush=True)
    from envbuild.apply.core import _link_report

    start = time.perf_counter()
    _link_report(gen_a, first.spec)
    took = time.perf_counter() - start
    print(f"| link check of generation {gen_a.number} (empty link-check cache) | {took:.1f} | |")
    gen_b, t, d = timed(lambda: realize(paths, second, {}, store=store).generation, work, 3)
    print(f"| second generation ({second.name}, sharing) | {t:.1f} | {d:.0f} |", flush=True)
    start = time.perf_counter()
    _link_report(gen_b, second.spec)
    took = time.perf_counter() - start
    print(
        f"| link check of generation {gen_b.number} (what apply runs on it next) | {took:.1f} | |"
    )
    start = time.perf_counter()
    found = find_reusable(paths, gen_b.meta.content_hash, store=store)
    assert found.generation is not None
    took = time.perf_counter() - start
    print(f"| verify generation {gen_b.number} (every tree hashed once) | {took:.1f} | 0 |")
    files = sum(len(f) for _t, _d, f in os.walk(gen_b.venv))
    print(
        f"generations {gen_a.number}, {gen_b.number}: {len(gen_b.meta.packages)} dists, "
        f"{files} files, {gen_b.meta.link_mode}"
    )
    shutil.rmtree(work / "plain", ignore_errors=True)
    remove_tree(work / "root")
    remove_tree(work / "store")


def first_pair(spec: str, before: Path, work: Path, rounds: int) -> None:
    """A first generation of ``spec`` by ``before``'s realize and by this checkout's,
    alternating, each in a process of its own with an empty uv cache, store and root."""
    print("| round | checkout | wall (s) | new disk (MB), uv cache included |")
    print("|---|---|---:|---:|")
    n = 0
    for r in range(1, rounds + 1):
        for tree in (before, REPO):
            n += 1
            os.environ["ENVBUILD_STORE"] = str(work / f"store-{n}")
            _none, t, d = timed(
                lambda t=tree, k=n: before_install(t, spec, work / f"r{k}"), work, n
            )
            git = ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"]
            rev = subprocess.run(git, check=True, capture_output=True, text=True).stdout.strip()
            print(f"| {r} | {rev} | {t:.1f} | {d:.0f} |", flush=True)
            remove_tree(work / f"r{n}")
            remove_tree(work / f"store-{n}")


#: ``envbuild apply`` with the fake GPUs of tests/support (NVML is all it fakes: a --root has no
#: systemd, so the unit is installed, not started); everything else is the real CLI.
CLI_MAIN = """
import io, json, os, sys, time
from dataclasses import replace
t0 = time.monotonic()
class Stamped(io.TextIOBase):  # each line of the log with the seconds since the start
    def __init__(self, raw):
        self.raw, self.start = raw, True
    def write(self, text):
        for part in text.splitlines(True):
            self.raw.write((f"[{time.monotonic() - t0:7.2f}] " if self.start else "") + part)
            self.start = part.endswith("\\n")
        return len(text)
    def flush(self):
        self.raw.flush()
sys.stderr = Stamped(sys.stderr)
from envbuild.apply import host as hostmod
from envbuild.apply.probe import SystemProbe
from envbuild.cli.main import main
from support.fakesystemd import FakeNvml
real, gpus = hostmod.real_host, json.loads(os.environ["BENCH_GPUS"])
def host(root, hf_home=hostmod.HF_HOME):
    return replace(real(root, hf_home), probe=SystemProbe(FakeNvml(**gpus)))
hostmod.real_host = host
sys.exit(main(sys.argv[1:]))
"""
TINY = 'repo = "bench/tiny-{name}"\nrevision = "{rev}"\nsize_gb = 0.001\nfiles = ["*.json"]\n'


def bench_specs(repo: Path, names: list[str], hub: object) -> list[Path]:
    """Each spec as ``bench-<name>``: the same (extends it), serving a tiny model from the
    local hub instead of its placeholder revision; locked with its Debian set kept."""
    out = []
    for n, name in enumerate(names):
        rev = f"{n + 1:040x}"
        hub.add(f"bench/tiny-{name}", rev, {"config.json": b'{"model_type": "llama"}'})  # type: ignore[attr-defined]
        spec = repo / "specs" / f"bench-{name}.toml"
        spec.write_text(f'extends = "{name}.toml"\n\n[model]\n' + TINY.format(name=name, rev=rev))
        lock = repo / "lockfiles" / f"pylock.bench-{name}.toml"
        shutil.copyfile(repo / "lockfiles" / f"pylock.{name}.toml", lock)
        done = subprocess.run(
            [sys.executable, "-m", "envbuild", "lock", str(spec), "--python-only"],
            cwd=repo, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode:
            raise SystemExit(f"lock of {spec.name} failed:\n{done.stderr[-2000:]}")
        out.append(spec)
    return out


def whole_apply(spec: Path, root: Path, env: dict[str, str], *extra: str) -> tuple[float, str]:
    """One ``envbuild apply`` process, timed from outside (/usr/bin/time: wall seconds)."""
    argv = ["/usr/bin/time", "-f", "%e %M", sys.executable, "-c", CLI_MAIN, "apply", str(spec),
            "--root", str(root), "--yes", *extra]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if log := env.get("BENCH_LOG"):  # the stamped log of each step, to see where time goes
        with open(log, "a") as f:
            f.write(f"== apply {spec.name} --root {root}\n{done.stderr}\n")
    *_lines, last = done.stderr.strip().splitlines() or ["? ?"]
    if done.returncode:
        raise SystemExit(f"apply {spec.name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    wall, rss = last.split()
    return float(wall), f"{int(rss) / 1e3:.0f} MB"


def cli(names: list[str], work: Path) -> None:
    """The whole ``envbuild apply`` command, as a user runs it: A into a root (its trees made),
    B into the same root (the second experiment: another model and command, every tree
    shared), then B into a second root sharing the store (a generation that shares the wheels
    and the exact command: the parser's verdict known; under a --root the HF cache is the
    root's, so the model check runs again), then B again (reused)."""
    sys.path.insert(0, str(REPO / "tests"))
    from support import hfhub

    repo = work / "repo"
    (repo / ".git").mkdir(parents=True)
    for folder in ("specs", "lockfiles"):
        shutil.copytree(REPO / folder, repo / folder)
    tests = str(REPO / "tests")
    with hfhub.serve() as hub:
        specs = bench_specs(repo, names, hub)
        env = {
            **os.environ,
            "ENVBUILD_STORE": str(work / "store"),
            "XDG_CACHE_HOME": str(work / "xdg"),  # an empty link-check cache
            "HF_ENDPOINT": hub.url,
            "HF_TOKEN": "bench-token",
            "PYTHONPATH": os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH")) if p),
            "BENCH_GPUS": json.dumps({"gpu_count": 8,
                                      "gpu_name": "NVIDIA RTX PRO 6000 Blackwell Server Edition"}),
        }  # fmt: skip
        a, b = specs[0], specs[-1]
        steps = [
            (f"first apply ({a.stem}: its trees made, vLLM checked)", a, work / "root-1", ()),
            (f"second experiment ({b.stem}, same root: another model and command)", b,
             work / "root-1", ()),
            (f"{b.stem} into a second root (same store and command: the parser's verdict "
             "known; the model is fetched into that root's HF cache and checked)", b,
             work / "root-2", ()),
            (f"{b.stem} again (up to date: the generation reused, fully checked)", b,
             work / "root-1", ()),
        ]  # fmt: skip
        print("| `envbuild apply` (whole process, /usr/bin/time) | wall (s) | peak RSS | "
              "load average before (1, 5 min) |")  # fmt: skip
        print("|---|---:|---:|---|")
        for label, spec, root, extra in steps:
            load = os.getloadavg()
            wall, rss = whole_apply(spec, root, env, *extra)
            print(f"| {label} | {wall:.1f} | {rss} | {load[0]:.2f}, {load[1]:.2f} |", flush=True)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--cli"]:
        # --cli [A B]: the whole `envbuild apply` process, first and second experiment
        names = argv[1:] or ["kimi-k25-int4", "minimax-m25-fp8"]
        with tempfile.TemporaryDirectory(prefix="envbuild-bench-cli-") as tmp:
            cli(names, Path(tmp))
        return
    if argv[:1] == ["--first-pair"]:
        # --first-pair --before DIR [SPEC]: is a first generation slower than before?
        before = Path(argv[argv.index("--before") + 1]).resolve()
        rest = [a for a in argv[1:] if a not in ("--before", str(argv[argv.index("--before") + 1]))]
        with tempfile.TemporaryDirectory(prefix="envbuild-bench-first-") as tmp:
            first_pair(rest[0] if rest else "specs/minimax-m25-fp8.toml", before, Path(tmp), 2)
        return
    if argv[:1] == ["--shared"]:
        rest = argv[1:]
        before = None
        if "--before" in rest:
            at = rest.index("--before")
            before = Path(rest[at + 1]).resolve()
            del rest[at : at + 2]
        a, b = rest[:2] if len(rest) >= 2 else (DEFAULT[1], "specs/minimax-m25-fp8.toml")
        with tempfile.TemporaryDirectory(prefix="envbuild-bench-shared-") as tmp:
            # the store apply's link check finds the trees in, and an empty link-check cache
            os.environ["ENVBUILD_STORE"] = str(Path(tmp) / "store")
            os.environ["XDG_CACHE_HOME"] = str(Path(tmp) / "xdg")
            shared(a, b, Path(tmp), before)
        return
    print(
        "| spec | distributions | venv files | venv GB | cold (s) | warm (s) | verify (s) | "
        "`generations --verify`, whole process (s) | load average |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for spec in argv or DEFAULT:
        with tempfile.TemporaryDirectory(prefix="envbuild-bench-apply-") as tmp:
            print(one(spec, Path(tmp)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
