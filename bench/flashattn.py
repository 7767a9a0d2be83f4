"""The real flash-attn source build, through envbuild, measured (issue #16).

    python bench/flashattn.py build  [--spec specs/glm5-gguf.toml] [--store DIR] [--max-jobs N]
    python bench/flashattn.py record [--store DIR]

``build`` realizes the spec's flash-attn derivation with
:func:`envbuild.sourcebuild.realize.realize` and
the host builder, exactly as ``envbuild build`` does, except that ``MAX_JOBS`` is left to
envbuild's memory model (``--max-jobs N`` pins it instead): ``MAX_JOBS`` and ``NVCC_THREADS`` are
not inputs of the derivation key, so the wheel is stored under the very key glm5-gguf's build has.
While it runs, a sampler thread reads ``/proc`` every second and records the RSS of the whole
process tree (its peak is ``peak_rss_bytes``) and of each nvcc compile job (nvcc and the cicc,
ptxas, gcc it starts: the per-job peak is what the memory model needs). Output, under
``bench/out/`` (not committed):

* ``flash-attn.build.log``: envbuild's log with every line of the build, timestamped (ninja's
  ``[n/N]`` progress lines among them);
* ``flash-attn.samples.jsonl``: one line per second: ``t``, ``rss`` (the tree), ``jobs``;
* ``flash-attn.jobs.json``: each compile job's peak RSS and duration, rewritten as jobs finish;
* ``flash-attn.done.json``: the build's result (key, wheel, wall time) when it ends.

``record`` reads those files and the store and writes ``bench/results/flash-attn.json``: the
finished build's figures, or, while it is still running or when it was stopped, the measured rate
(objects per minute from ninja's lines), the per-job peaks and the projected total. With
``--cache-hit`` it first realizes the same build again and times the store hit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import re
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: Where a build's log and samples go; FLASHATTN_BENCH_OUT points ``record`` at another
#: checkout's (a build started in one worktree, recorded from another).
OUT = Path(os.environ.get("FLASHATTN_BENCH_OUT") or HERE / "out")
LOG = OUT / "flash-attn.build.log"
SAMPLES = OUT / "flash-attn.samples.jsonl"
JOBS = OUT / "flash-attn.jobs.json"
DONE = OUT / "flash-attn.done.json"
RESULT = HERE / "results" / "flash-attn.json"
DEFAULT_STORE = Path.home() / ".cache" / "envbuild" / "bench-flash-attn-store"
PAGE = os.sysconf("SC_PAGE_SIZE")


# --- the sampler ---------------------------------------------------------------------------------


def _procs() -> dict[int, tuple[int, int, str, list[str]]]:
    """pid -> (ppid, rss bytes, comm, argv) of every readable process."""
    out: dict[int, tuple[int, int, str, list[str]]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        out[pid] = (ppid, rss, comm, [a.decode(errors="replace") for a in argv if a])
    return out


def _source_of(argv: list[str]) -> str:
    """The file a compile job compiles (torch's ninja rule writes ``-c -c FILE``)."""
    return next((a for a in argv if a.endswith((".cu", ".cpp"))), "?")


class Sampler(threading.Thread):
    """Every second: the RSS of ``root``'s process tree, and of each nvcc job's subtree."""

    def __init__(self, root: int, limit: int | None) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.limit = limit
        self.peak = 0
        self.jobs: dict[int, dict[str, Any]] = {}  # nvcc pid -> source, start, end, peak
        self.stop = threading.Event()

    def run(self) -> None:
        with SAMPLES.open("a") as out:
            while not self.stop.wait(1.0):
                self.sample(out)

    def sample(self, out: Any) -> None:
        procs = _procs()
        children: dict[int, list[int]] = {}
        for pid, (ppid, *_rest) in procs.items():
            children.setdefault(ppid, []).append(pid)

        def tree(pid: int) -> list[int]:
            todo, seen = [pid], []
            while todo:
                p = todo.pop()
                seen.append(p)
                todo += children.get(p, [])
            return seen

        mine = tree(self.root)
        total = sum(procs[p][1] for p in mine if p in procs)
        self.peak = max(self.peak, total)
        now = time.time()
        live: dict[str, int] = {}
        for pid in mine:
            ppid, _, comm, argv = procs[pid]
            if comm != "nvcc" or procs.get(ppid, (0, 0, ""))[2] == "nvcc":
                continue
            rss = sum(procs[p][1] for p in tree(pid) if p in procs)
            job = self.jobs.setdefault(
                pid, {"source": _source_of(argv), "start": now, "end": now, "peak": 0}
            )
            job["end"], job["peak"] = now, max(job["peak"], rss)
            live[Path(job["source"]).name] = rss
        out.write(json.dumps({"t": round(now, 1), "rss": total, "jobs": live}) + "\n")
        out.flush()
        if int(now) % 15 == 0:
            self.write_jobs()
        if self.limit and total > self.limit:
            logging.getLogger("bench").error(
                "the build's tree holds %.1f GiB, over the %.1f GiB limit: stopping it",
                total / 2**30,
                self.limit / 2**30,
            )
            for pid in sorted(mine, reverse=True):
                if pid != self.root:
                    with contextlib.suppress(OSError):
                        os.kill(pid, 9)

    def write_jobs(self) -> None:
        rows = sorted(self.jobs.values(), key=lambda j: j["start"])
        JOBS.write_text(json.dumps({"peak_rss_bytes": self.peak, "jobs": rows}, indent=1) + "\n")


# --- build ---------------------------------------------------------------------------------------


def _request(spec: Path, max_jobs: int | None) -> Any:
    from envbuild.lock.core import lock_path
    from envbuild.lock.io import read_lock
    from envbuild.sourcebuild.requests import build_requests
    from envbuild.spec.load import load_spec

    loaded = load_spec(spec)
    lock = read_lock(lock_path(loaded))
    req = next(r for r in build_requests(loaded, lock) if r.dist == "flash-attn")
    env = {k: v for k, v in req.env.items() if k != "MAX_JOBS"}
    if max_jobs:
        env["MAX_JOBS"] = str(max_jobs)
    return loaded, req.model_copy(update={"env": env})


def build(args: argparse.Namespace) -> int:
    from envbuild.sourcebuild.builder import HostBuilder
    from envbuild.sourcebuild.realize import realize
    from envbuild.store.core import Store

    OUT.mkdir(exist_ok=True)
    # the build's own pid and session (start it with setsid: then every process of the build,
    # ninja's own process groups too, is in this session; stop them all with
    #   for g in $(ps -eo sid=,pgid= | awk -v s=SID '$1==s{print $2}' | sort -u)
    #   do kill -- -$g; done
    (OUT / "build.pid").write_text(f"{os.getpid()} {os.getsid(0)}\n")
    logging.basicConfig(
        level=logging.DEBUG,
        filename=LOG,
        format="%(asctime)s.%(msecs)03d %(name)s %(levelname)s %(message)s",
        datefmt="%Y-%m-%dT%H:%M:%S",
    )
    logging.Formatter.converter = time.gmtime
    sampler = Sampler(os.getpid(), int(args.rss_limit_gib * 2**30) if args.rss_limit_gib else None)
    sampler.start()
    loaded, req = _request(args.spec, args.max_jobs)
    store = Store(args.store)
    start = time.monotonic()
    started = datetime.now(UTC).isoformat(timespec="seconds")
    done: dict[str, Any] = {"started": started, "spec": str(args.spec), "store": str(args.store)}
    try:
        result = realize(req, HostBuilder(loaded.spec.python.version), store)
        done |= {"ok": True, "result": result.model_dump(mode="json")}
    except Exception as exc:  # the record says how it ended, whatever it was
        done |= {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        logging.getLogger("bench").exception("the build failed")
    finally:
        sampler.stop.set()
        sampler.join()
        sampler.write_jobs()
        done |= {"wall_s": round(time.monotonic() - start, 1), "peak_rss_bytes": sampler.peak}
        DONE.write_text(json.dumps(done, indent=1) + "\n")
    return 0 if done["ok"] else 1


# --- record --------------------------------------------------------------------------------------

_NINJA = re.compile(r"^(\S+) envbuild\.proc DEBUG uv build: \[(\d+)/(\d+)\] ")


def ninja_progress(log: str) -> list[tuple[float, int, int]]:
    """(unix time, n, N) of each of ninja's ``[n/N]`` lines in the timestamped log."""
    out = []
    for line in log.splitlines():
        m = _NINJA.match(line)
        if m:
            t = datetime.strptime(m.group(1)[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
            out.append((t.timestamp(), int(m.group(2)), int(m.group(3))))
    return out


def _cpu_seconds() -> float | None:
    """CPU seconds the running build has used so far: ninja's finished children (cutime,
    cstime: every compile job it waited for) plus what its live descendants have used."""
    tick = os.sysconf("SC_CLK_TCK")
    procs = _procs()
    ninja = [p for p, (_, _, comm, _) in procs.items() if comm == "ninja"]
    pid_file = OUT / "build.pid"
    root = pid_file.read_text().split()[0] if pid_file.exists() else ""
    total = 0.0
    for pid in ninja:
        chain, p = [], pid
        while p in procs and p > 1:
            chain.append(p)
            p = procs[p][0]
        if root and int(root) not in chain:
            continue
        todo = [pid]
        while todo:
            q = todo.pop()
            try:
                stat = Path(f"/proc/{q}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            total += sum(int(x) for x in fields[11:15]) / tick
            todo += [c for c, (pp, *_r) in procs.items() if pp == q]
        return total
    return None


def _build_alive() -> bool:
    """Whether the process bench/out/build.pid names is still alive."""
    try:
        pid = int((OUT / "build.pid").read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return False
    return True


def _earlier(jobs_file: Path) -> dict[str, Any]:
    """What a stopped earlier run (its files renamed ``attempt*``) measured."""
    name = jobs_file.name.removesuffix(".jobs.json")
    data = json.loads(jobs_file.read_text())
    log = (OUT / f"{name}.build.log").read_text(errors="replace")
    progress = ninja_progress(log)
    m = re.search(r"building with MAX_JOBS=(\d+)", log)
    first = re.match(r"^(\S+) ", log)
    rows = data["jobs"]
    return {
        "run": name,
        "max_jobs": int(m.group(1)) if m else None,
        "peak_rss_bytes": data["peak_rss_bytes"],
        "objects_done": progress[-1][1] if progress else 0,
        "elapsed_s": round(progress[-1][0] - _stamp(first.group(1)))
        if progress and first
        else None,
        "jobs": [
            {
                "source": Path(j["source"]).name,
                "peak_rss_bytes": j["peak"],
                "seconds": round(j["end"] - j["start"]),
            }
            for j in rows
        ],
    }


def _stamp(text: str) -> float:
    return datetime.strptime(text[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp()


def _toolchain(spec: Path) -> dict[str, Any]:
    """The build's key, torch, nvcc and flags, as envbuild computes them here."""
    from envbuild.sourcebuild.builder import HostBuilder
    from envbuild.sourcebuild.inputs import inputs_of
    from envbuild.sourcebuild.requests import KIND
    from envbuild.store.core import derivation_key

    loaded, req = _request(spec, None)
    builder = HostBuilder(loaded.spec.python.version)
    tools = builder.probe(cuda=True)
    inputs = inputs_of(req, tools, builder)
    return {
        "key": derivation_key(KIND, inputs),
        "torch": req.torch.version if req.torch else None,
        "nvcc": tools.nvcc.version if tools.nvcc else None,
        "nvcc_path": tools.nvcc.path if tools.nvcc else None,
        "nvcc_threads": int(req.build_env.get("NVCC_THREADS", "4")),
        "flags": {k: v for k, v in sorted(req.build_env.items()) if k != "MAX_JOBS"},
        "requested_archs": sorted(
            {f"sm_{a}" for a in req.build_env["FLASH_ATTN_CUDA_ARCHS"].split(";")}
        ),
        "spec": str(spec.relative_to(ROOT) if spec.is_absolute() else spec),
    }


def _machine() -> dict[str, Any]:
    mem = next(
        int(line.split()[1]) * 1024
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    return {"cores": os.cpu_count(), "memory_bytes": mem, "machine": platform.machine()}


def record(args: argparse.Namespace) -> int:
    from envbuild.sourcebuild.audit import audit_wheel
    from envbuild.store.core import Store

    figures: dict[str, Any] = {"machine": _machine()}
    log = LOG.read_text(errors="replace") if LOG.exists() else ""
    jobs = json.loads(JOBS.read_text()) if JOBS.exists() else {"jobs": [], "peak_rss_bytes": 0}
    done = json.loads(DONE.read_text()) if DONE.exists() else None
    m = re.search(r"building with MAX_JOBS=(\d+) \(([^)]*)\)", log)
    figures |= {
        "max_jobs": int(m.group(1)) if m else None,
        "max_jobs_how": m.group(2) if m else None,
    }
    figures |= _toolchain(args.spec)
    first = re.match(r"^(\S+) ", log)
    start = _stamp(first.group(1)) if first else None
    progress = ninja_progress(log)
    last = re.findall(r"^(\S+) ", log, re.MULTILINE)
    last_seen = max((j["end"] for j in jobs["jobs"]), default=0)
    running = done is None
    finished = [
        j
        for j in jobs["jobs"]
        if j["end"] > j["start"] and not (running and j["end"] > last_seen - 5)
    ]
    peaks = sorted(j["peak"] for j in finished)
    figures["per_job"] = {
        "jobs_sampled": len(peaks),
        "peak_rss_bytes_max": peaks[-1] if peaks else None,
        "peak_rss_bytes_median": peaks[len(peaks) // 2] if peaks else None,
        "seconds_median": sorted(j["end"] - j["start"] for j in finished)[len(finished) // 2]
        if finished
        else None,
        "heaviest": [
            {"source": Path(j["source"]).name, "peak_rss_bytes": j["peak"]}
            for j in sorted(finished, key=lambda j: -j["peak"])[:5]
        ],
    }
    sampled_peak = max(
        [jobs.get("peak_rss_bytes", 0)]
        + [
            json.loads(line)["rss"]
            for line in (SAMPLES.read_text().splitlines() if SAMPLES.exists() else [])
        ]
    )
    figures["peak_rss_bytes"] = sampled_peak
    if progress and start:
        _, n1, total = progress[-1]
        end = _stamp(last[-1]) if done and last else time.time()
        elapsed = end - start
        rate = n1 / (elapsed / 60) if elapsed > 0 else None
        figures["objects"] = {
            "done": n1,
            "total": total,
            "per_minute": round(rate, 3) if rate else None,
            "elapsed_s": round(elapsed),
            "note": "ninja compiles the objects in name order: flash_api.cpp, then the 24 bwd "
            "kernels (the slowest and heaviest), then 48 fwd ones, so a projection made early "
            "overstates the whole build's time",
        }
        if rate:
            figures["projected_total_s"] = round(total / rate * 60)
        cpu = _cpu_seconds() if done is None else None
        if cpu and n1 > 1:
            per = cpu / n1
            figures["cpu"] = {
                "cpu_s": round(cpu),
                "cpu_s_per_object": round(per),
                "share_of_2_cores": round(cpu / elapsed / 2, 3),
                "projected_on_2_idle_cores_s": round(per * total / 2),
                "projected_on_1_idle_core_s": round(per * total),
                "how": "ninja's cutime+cstime (the compile jobs it waited for) plus its live "
                "descendants' CPU time, while the build runs, over the objects finished (the "
                "running jobs' CPU counts too, so per object it is an upper bound)",
            }
    if done and done.get("ok"):
        result = done["result"]
        store = Store(Path(done["store"]))
        wheel = store.blob_path(result["wheel_digest"])
        audit = audit_wheel(wheel)
        figures |= {
            "finished": True,
            "wall_s": done["wall_s"],
            "key": result["key"],
            "wheel": result["wheel"],
            "wheel_sha256": result["wheel_digest"].removeprefix("sha256:"),
            "wheel_bytes": wheel.stat().st_size,
            "archs": audit.sass,
            "ptx": audit.ptx,
        }
        figures["import"] = verify_import(args.spec, wheel, result["wheel"])
        if args.cache_hit and figures["key"] != result["key"]:
            # the code computes another key than the build had (a merge changed an input or
            # the store's format): realize() would build again for hours, not hit the cache
            figures["cache_hit_s"] = None
            figures["cache_hit_note"] = (
                f"not measured: the key here is {figures['key'][:12]}, the build's "
                f"{result['key'][:12]}; `envbuild store add-wheel` the wheel under the new key"
            )
        elif args.cache_hit:
            _, req = _request(args.spec, None)
            from envbuild.sourcebuild.builder import HostBuilder
            from envbuild.sourcebuild.realize import realize

            t = time.monotonic()
            again = realize(req, HostBuilder("3.11"), store)
            figures["cache_hit_s"] = round(time.monotonic() - t, 2)
            figures["cache_hit_reused"] = again.reused
        elif RESULT.exists():
            old = json.loads(RESULT.read_text())
            for k in ("cache_hit_s", "cache_hit_reused", "cpu"):
                if k in old:
                    figures[k] = old[k]
    else:
        if "cpu" not in figures and RESULT.exists():
            figures["cpu"] = json.loads(RESULT.read_text()).get("cpu")
        figures["finished"] = False
        if done is not None:
            figures["state"] = f"ended without a wheel: {done.get('error')}"
        else:  # no record of its end: running, or stopped (killed) while it ran
            figures["state"] = "running" if _build_alive() else "stopped before it finished"
    figures["earlier_runs"] = [_earlier(p) for p in sorted(OUT.glob("attempt*.jobs.json"))]
    RESULT.parent.mkdir(exist_ok=True)
    RESULT.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    print(json.dumps(figures, indent=1, sort_keys=True))
    if args.results_md:
        write_section(figures)
    return 0


SECTION = "## flash-attn (`python3 bench/flashattn.py build`, then `record`)"


def _gb(n: float | None) -> str:
    return f"{n / 1e9:.1f} GB" if n else "-"


def write_section(f: dict[str, Any]) -> None:
    """Replace bench/RESULTS.md's flash-attn section with the measured figures."""
    obj = f.get("objects") or {}
    per = f.get("per_job") or {}
    rows = [
        ("state", "finished" if f.get("finished") else str(f.get("state"))),
        ("spec", f"{f.get('spec')} (MAX_JOBS left to envbuild's memory model)"),
        ("key", f"`{str(f.get('key'))[:12]}`"),
        ("torch / nvcc", f"{f.get('torch')} / {f.get('nvcc')} ({f.get('nvcc_path')})"),
        ("archs asked / found", f"{f.get('requested_archs')} / {f.get('archs', '-')}"),
        ("max_jobs x nvcc_threads", f"{f.get('max_jobs')} x {f.get('nvcc_threads')}"),
        ("peak_rss_bytes (whole tree)",
         f"{f.get('peak_rss_bytes')} ({_gb(f.get('peak_rss_bytes'))})"),
        ("per job: max / median peak", f"{_gb(per.get('peak_rss_bytes_max'))} / "
         f"{_gb(per.get('peak_rss_bytes_median'))} ({per.get('jobs_sampled')} finished jobs)"),
        ("per job: median wall", f"{round(per.get('seconds_median') or 0)} s"),
        ("objects", f"{obj.get('done')}/{obj.get('total')} in {obj.get('elapsed_s')} s: "
         f"{obj.get('per_minute')} per minute"),
        ("projected compile", f"{f.get('projected_total_s', '-')} s at that rate"),
        ("CPU used (share of 2 cores)", f"{(f.get('cpu') or {}).get('cpu_s')} s "
         f"({(f.get('cpu') or {}).get('share_of_2_cores')}), "
         f"{(f.get('cpu') or {}).get('cpu_s_per_object')} s per object"),
        ("projected on idle cores: 2 jobs / 1 job",
         f"{(f.get('cpu') or {}).get('projected_on_2_idle_cores_s')} s / "
         f"{(f.get('cpu') or {}).get('projected_on_1_idle_core_s')} s"),
        ("wall_s", str(f.get("wall_s", "-"))),
        ("wheel", f"{f.get('wheel', '-')} ({f.get('wheel_bytes', '-')} bytes, sha256 "
         f"{str(f.get('wheel_sha256', '-'))[:16]}…)"),
        ("cache_hit_s", str(f.get("cache_hit_s", "-"))),
        ("import beside the lock's torch", str((f.get("import") or {}).get("ok", "-"))),
    ]  # fmt: skip
    heavy = ", ".join(
        f"{h['source'].removesuffix('.cu')} {_gb(h['peak_rss_bytes'])}"
        for h in per.get("heaviest", [])
    )
    m = f["machine"]
    idle = (f.get("cpu") or {}).get("projected_on_2_idle_cores_s")
    fits = "" if not idle else (", within 3 hours" if idle < 3 * 3600 else ", over 3 hours")
    text = "\n".join(
        [
            SECTION,
            "",
            f"The real flash-attn 2.8.3.post2 build for SM120 through envbuild's host builder "
            f"(issue #16), on {m['cores']} cores and {_gb(m['memory_bytes'])} of memory, at nice "
            "19 beside six other helpers' test runs (load average ~8-9): the CPU share it got, "
            "not the machine, sets the rate. Figures from `bench/results/flash-attn.json`; "
            "`python3 bench/flashattn.py record --results-md` rewrites this section.",
            "",
            "| figure | value |",
            "|---|---|",
            *[f"| {k} | {v} |" for k, v in rows],
            "",
            f"Heaviest jobs: {heavy or '-'}.",
            "",
            *[
                f"Earlier run `{r['run']}` (MAX_JOBS={r['max_jobs']}, stopped; jobs running then "
                "were cut short): "
                f"{r['objects_done']} objects in {r['elapsed_s']} s, tree peak "
                f"{_gb(r['peak_rss_bytes'])}; jobs: "
                + ", ".join(
                    f"{j['source'].removesuffix('.cu')} {_gb(j['peak_rss_bytes'])}"
                    for j in r["jobs"]
                )
                + ".\n"
                for r in f.get("earlier_runs", [])
                if r["jobs"]
            ],
            "What the figures say. One compile job for one arch (sm_120) peaks at the per-job "
            "figure above, nearly all of it one cicc: that is the knowledge base's "
            "`[[build_memory]]` model for flash-attn (0.5 GB + 7.0 GB per arch nvcc compiles "
            "at once), from which envbuild chose MAX_JOBS within the build's memory budget "
            "(ENVBUILD_BUILD_MEMORY=12GiB on this machine shared with six other helpers; with "
            "all 24 GB it would choose 2, one per core) and warns that glm5-gguf's pinned 16 x "
            "4 would need ~120 GB. The build's rate here is set by the "
            "CPU share a nice-19 job gets on a shared machine (the share column); on 2 idle "
            f"cores the same CPU time takes the projected figure{fits}. CI (90 "
            "minutes on 2 cores for everything) must never build it: a wheel built once is "
            "found by its key (`envbuild store add-wheel`, or a remote cache with `--cache`), "
            "and MAX_JOBS/NVCC_THREADS are not in the key, so a big machine's build serves "
            "every machine with the same toolchain.",
            "",
            "The first attempt (2026-12-01, before envbuild handled them) stopped in its first "
            "two compile jobs, 4 s in: `cuda_fp16.h:4492: fatal error: nv/target: No such file "
            "or directory` (the wheels' toolkit had no CCCL) and `ATen/ATen.h:5: #error C++20 or "
            "later compatible compiler is required to use ATen.` (setup.py's -std=c++17). "
            "envbuild now refuses a toolkit without CCCL before building, applies the knowledge "
            "base's C++20 patch to the sdist for torch >= 2.13 (keyed), and gives the build a "
            "CUDA_HOME holding the venv's cuBLAS/cuSPARSE/cuSOLVER headers and a libcudart.so "
            "link (docs/sourcebuild.md). setup.py never tried its prebuilt-wheel download "
            "(FLASH_ATTENTION_FORCE_BUILD=TRUE, forced by envbuild).",
            "",
            "Reproduce: `ENVBUILD_NVCC=<nvcc 13.0.88 from NVIDIA's wheels> "
            "ENVBUILD_BUILD_MEMORY=12GiB setsid nohup nice -n 19 python3 bench/flashattn.py "
            "build &` (log and samples in bench/out/, its pid and session in bench/out/build.pid), "
            "then "
            "`python3 bench/flashattn.py record --results-md` (add `--cache-hit` once it has "
            "finished: it times the second realize, installs the wheel beside the lock's torch "
            "and imports it).",
            "",
        ]
    )
    path = HERE / "RESULTS.md"
    old = path.read_text()
    if SECTION in old:
        head, _, rest = old.partition(SECTION)
        tail = rest[rest.find("\n## ") + 1 :] if "\n## " in rest else ""
        new = head + text + ("\n" + tail if tail else "")
    else:
        new = old.rstrip("\n") + "\n\n" + text
    path.write_text(new)


def verify_import(spec: Path, blob: Path, filename: str) -> dict[str, Any]:
    """The wheel installed into a fresh venv beside the lock's torch and einops (pinned to the
    lock's versions of torch's closure): ``import flash_attn`` and ``flash_attn_func`` resolve,
    which loads flash_attn_2_cuda's CUDA libraries (no kernel runs, no GPU needed)."""
    import shutil
    import subprocess

    from envbuild.lock.core import lock_path
    from envbuild.lock.io import read_lock
    from envbuild.proc.core import find_uv

    loaded, req = _request(spec, None)
    lock = read_lock(lock_path(loaded))
    einops = lock.package("einops")
    venv = OUT / "verify-venv"
    shutil.rmtree(venv, ignore_errors=True)
    wheel = OUT / filename
    shutil.copyfile(blob, wheel)
    (OUT / "verify-constraints.txt").write_text("\n".join(req.constraints) + "\n")
    uv = find_uv()
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    subprocess.run([uv, "venv", "-q", "--python", "3.11", str(venv)], check=True, env=env)
    python = str(venv / "bin" / "python")
    subprocess.run(
        [uv, "pip", "install", "-q", "--python", python, "--constraint",
         str(OUT / "verify-constraints.txt"), f"torch=={req.torch.version}",
         f"einops=={einops.version}" if einops else "einops", str(wheel)],
        check=True, env=env,
    )  # fmt: skip
    code = (
        "import flash_attn, flash_attn_2_cuda; from flash_attn import flash_attn_func; "
        "print(flash_attn.__version__, flash_attn_func.__module__, flash_attn_2_cuda.__file__)"
    )
    done = subprocess.run(
        [python, "-c", code], check=False, capture_output=True, text=True, env=env
    )
    return {
        "ok": done.returncode == 0,
        "output": (done.stdout + done.stderr).strip()[-2000:],
        "venv": str(venv),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--spec", type=Path, default=ROOT / "specs" / "glm5-gguf.toml")
    b.add_argument("--store", type=Path, default=DEFAULT_STORE)
    b.add_argument("--max-jobs", type=int, default=None)
    b.add_argument("--rss-limit-gib", type=float, default=14.0)
    b.set_defaults(func=build)
    r = sub.add_parser("record")
    r.add_argument("--spec", type=Path, default=ROOT / "specs" / "glm5-gguf.toml")
    r.add_argument("--cache-hit", action="store_true", help="time a second realize (a hit)")
    r.add_argument("--results-md", action="store_true", help="rewrite bench/RESULTS.md's section")
    r.set_defaults(func=record)
    args = parser.parse_args()
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
