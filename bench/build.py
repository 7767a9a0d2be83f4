#!/usr/bin/env python3
"""Benchmark of `envbuild build` against plain tar/zstd/gzip and `docker build` (not a test).

    python3 bench/build.py                   # cpu-stack image, envbuild vs docker (vfs engine)
    python3 bench/build.py --kimi            # also the real kimi-nvfp4 lock (4.3 GB of wheels)
    python3 bench/build.py --no-docker       # envbuild and packing only

What it measures, in one run on this machine (results as JSON in WORK/results.json and a markdown
table on stdout, for bench/RESULTS.md):

* envbuild cold build into an empty store, split into download (fetch), base (mmdebstrap),
  install (uv), pack (tar + compress + hash) and image (config, layout, docker archive);
* packing MB/s of the biggest layer's tree: envbuild (zstd, gzip, none) against
  ``tar --sort=name | zstd -T0 -3``, ``| pigz -6`` and ``| gzip -6`` over the same files, and
  sha256 alone (the hash part);
* the warm no-op rebuild (median of ``--runs``), in process and as a whole ``envbuild build``
  process (:mod:`wholeproc`: start-up included, CPU and wall seconds, with the load average);
* a one-package bump (tqdm 4.67.1 -> 4.67.0; relocked, not timed): time and bytes rebuilt;
* ``docker build`` of ``envbuild dockerfile`` on a private dockerd (vfs, classic builder): two
  cold builds (same image ID?), a cached no-op, the same bump. The build gets the proxy variables
  and the CA bundle through build args (bench only).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

import wholeproc  # noqa: E402

from envbuild.build import layerbuild, layers  # noqa: E402
from envbuild.build.entries import tree_entries  # noqa: E402
from envbuild.build.install import install  # noqa: E402
from envbuild.installed.venv import VenvTarget  # noqa: E402
from envbuild.lock.core import lock_path, lock_spec  # noqa: E402
from envbuild.pipeline import core as build_mod  # noqa: E402
from envbuild.pipeline import planner  # noqa: E402
from envbuild.pipeline.dockerfile import render_dockerfile  # noqa: E402
from envbuild.spec import load_spec  # noqa: E402
from envbuild.store.core import Store  # noqa: E402

MB = 1e6


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@contextmanager
def timed(into: dict[str, float], key: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        into[key] = into.get(key, 0.0) + time.perf_counter() - start


def make_repo(work: Path, spec: Path, extra: str = "", lockfile: Path | None = None) -> Path:
    """A throwaway repository holding a copy of ``spec`` (and the files it extends)."""
    repo = work / f"repo-{spec.stem}"
    shutil.rmtree(repo, ignore_errors=True)
    (repo / ".git").mkdir(parents=True)
    shutil.copytree(spec.parent, repo / "specs")
    target = repo / "specs" / spec.name
    target.write_text(target.read_text() + extra)
    if lockfile is not None:
        # reuse a committed lock; only its spec hash changes with ``extra`` (bench only)
        loaded = load_spec(target)
        text = lockfile.read_text()
        text = re.sub(
            r'^spec-hash = "[0-9a-f]{64}"$', f'spec-hash = "{loaded.spec_hash()}"', text, flags=re.M
        )
        dest = lock_path(loaded)
        dest.parent.mkdir(parents=True)
        dest.write_text(text)
    else:
        lock_spec(load_spec(target))
    return target


def envbuild_build(
    spec: Path, store: Path, out: Path, *, docker_archive: bool = True
) -> tuple[build_mod.ImageBuild, dict[str, float]]:
    """One build in-process with install and pack timed separately."""
    parts: dict[str, float] = {}
    real_install, real_pack = layerbuild.install, layerbuild.pack

    def install_timed(*a: Any, **kw: Any) -> Any:
        with timed(parts, "install"):
            return real_install(*a, **kw)

    def pack_timed(*a: Any, **kw: Any) -> Any:
        with timed(parts, "pack"):
            return real_pack(*a, **kw)

    layerbuild.install, layerbuild.pack = install_timed, pack_timed  # type: ignore[assignment]
    try:
        start = time.perf_counter()
        result = build_mod.build(
            load_spec(spec), store=Store(store), output=out, docker_archive=docker_archive
        )
        parts["total"] = time.perf_counter() - start
    finally:
        layerbuild.install, layerbuild.pack = real_install, real_pack  # type: ignore[assignment]
    for key, value in result.timings.items():
        parts[f"stage:{key}"] = value
    return result, parts


def seed_base(src: Store, dst: Store) -> None:
    """Copy the base's derivations (everything but layers and overlap reports) and their blobs."""
    with dst.session():
        for key in src.derivations():
            drv = src.lookup(key)
            if drv is None or drv.kind in ("layer", "overlaps"):
                continue
            for digest in drv.outputs.values():
                dst.add_file(src.blob_path(digest), expected=digest)
            dst.record(drv.kind, drv.inputs, drv.outputs, drv.meta)


def run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw)


# --- envbuild -----------------------------------------------------------------------------------


def bench_envbuild(
    spec: Path,
    work: Path,
    runs: int,
    bump: tuple[str, str] | None,
    *,
    big: bool = False,
) -> dict[str, Any]:
    """``big``: no docker archive and no second cold build (disk: 9 GB installed, 9 GB of uv
    cache, 4 GB of layers)."""
    archive = not big
    name = spec.stem
    store, out = work / f"store-{name}", work / f"out-{name}"
    shutil.rmtree(store, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    log(f"{name}: cold build into an empty store")
    result, cold = envbuild_build(spec, store, out, docker_archive=archive)
    assert result.manifest is not None
    m = result.manifest
    layer_bytes = sum(x.size for x in m.layers)
    res: dict[str, Any] = {
        "image": m.image,
        "layers": len(m.layers),
        "compressed_bytes": layer_bytes,
        "cold": cold,
    }
    staged = sum(
        int(Store(store).lookup(x.key).meta.get("file_bytes", 0))  # type: ignore[union-attr]
        for x in m.layers
        if x.kind != "base"
    )
    res["installed_bytes"] = staged
    log(f"{name}: cold {cold['total']:.1f} s, {staged / MB:.0f} MB installed")
    # docker starts FROM a base it already has: the same for envbuild, a store holding only the
    # base (its derivations and blobs), then every Python layer built cold
    if not big:
        seeded = work / f"store-{name}-base-only"
        shutil.rmtree(seeded, ignore_errors=True)
        seed_base(Store(store), Store(seeded))
        shutil.rmtree(work / f"out-{name}-base-only", ignore_errors=True)
        log(f"{name}: cold Python layers over a stored base")
        r0, cold_py = envbuild_build(spec, seeded, work / f"out-{name}-base-only")
        assert r0.manifest is not None and r0.manifest.image == m.image
        res["cold_python"] = cold_py
        log(f"{name}: cold Python layers {cold_py['total']:.1f} s")
        shutil.rmtree(seeded, ignore_errors=True)
    noop = []
    for _ in range(runs):
        r, t = envbuild_build(spec, store, out, docker_archive=archive)
        assert r.manifest is not None and r.manifest.image == m.image and not r.rebuilt
        noop.append(t["total"])
    res["noop_s"] = noop
    res["noop_median_s"] = statistics.median(noop)
    log(f"{name}: no-op median {res['noop_median_s']:.3f} s (in process: the build function only)")
    # as users feel it: `envbuild build` as a whole process (start-up and imports included)
    argv = ["build", "--store", str(store), "--output", str(out), str(spec)]
    if not archive:
        argv.insert(1, "--no-docker-archive")
    whole = wholeproc.timed(argv, {"this": REPO}, runs)
    res["noop_whole_process"] = whole
    log(f"{name}: no-op as a whole process: median {whole['this']['wall']:.3f} s wall, "
        f"{whole['this']['cpu']:.3f} s CPU, load average {whole['load_start']:.1f} to "
        f"{whole['load_end']:.1f}")  # fmt: skip
    if bump:
        pkg, version = bump
        text = spec.read_text()
        bumped_text = re.sub(
            rf'^{re.escape(pkg)} = "[^"]*"', f'{pkg} = "=={version}"', text, flags=re.M
        )
        assert bumped_text != text, f"{pkg} is not pinned in {spec}"
        spec.write_text(bumped_text)
        lock_spec(load_spec(spec))
        r2, t2 = envbuild_build(spec, store, out)
        assert r2.manifest is not None
        before = {x.name: x.digest for x in m.layers}
        changed = [x for x in r2.manifest.layers if before.get(x.name) != x.digest]
        res["bump"] = {
            "package": f"{pkg}=={version}",
            "seconds": t2["total"],
            "rebuilt_layers": r2.rebuilt,
            "changed_layers": [x.name for x in changed],
            "bytes_rebuilt": sum(x.size for x in changed),
            "timings": t2,
        }
        spec.write_text(text)
        lock_spec(load_spec(spec))
        log(f"{name}: bump {pkg} -> {t2['total']:.1f} s, layers {r2.rebuilt}")
    res["store"] = str(store)
    return res


# --- packing --------------------------------------------------------------------------------------


def biggest_dist_tree(spec: Path, store_dir: Path, work: Path) -> tuple[Path, str]:
    """Install the biggest planned distribution into a fresh staging tree."""
    loaded = load_spec(spec)
    lock, lock_hash = planner.load_lock(loaded)
    plan = planner.make_plan(loaded, lock, lock_hash=lock_hash)
    big = max((x for x in plan.layers if x.dists), key=lambda x: x.wheel_bytes)
    store = Store(store_dir)
    root = work / "pack-tree"
    shutil.rmtree(root, ignore_errors=True)
    t = plan.target
    target = VenvTarget(
        str(t["venv"]), str(t["interpreter"]), str(t["python_version"]), t.get("platform")
    )
    refs = [(d.ref(""), store.blob_path(f"sha256:{d.sha256}")) for d in big.dists]
    install(refs, target, root)
    return root, big.name


def bench_packing(tree: Path, work: Path, runs: int) -> dict[str, Any]:
    """Pack ``tree`` with envbuild and with the shell peers in ``runs`` rounds; each round
    runs every variant once, in an order that rotates, so a pair (envbuild vs its peer) shares
    the machine's load. Medians, and the median of the per-round ratios, are reported."""
    scratch_dir = work / "pack-store"
    size = sum(p.stat().st_size for p in tree.rglob("*") if p.is_file() and not p.is_symlink())
    res: dict[str, Any] = {"tree_bytes": size, "load_before": os.getloadavg()}
    tar_bytes = 0

    def envbuild_pack(c: layers.Compression) -> Callable[[], Any]:
        def go() -> None:
            nonlocal tar_bytes
            shutil.rmtree(scratch_dir, ignore_errors=True)
            entries = tree_entries(tree)
            got = layers.write_layer(Store(scratch_dir), entries, compression=c, mtime=0)
            tar_bytes = got.uncompressed_size

        return go

    def shell(cmd: str) -> Callable[[], Any]:
        return lambda: subprocess.run(["sh", "-c", cmd], check=True)

    blob = work / "peer.tar"

    def sha() -> None:
        h = hashlib.sha256()
        with blob.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)

    tar = f"tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - -C {tree} ."
    variants: dict[str, Callable[[], Any]] = {
        **{f"envbuild_{c.value}": envbuild_pack(c) for c in layers.Compression},
        "tar_only": shell(f"{tar} | cat > /dev/null"),
        "tar_zstd": shell(f"{tar} | zstd -T0 -3 -q -c > {work}/peer.out"),
        "tar_pigz": shell(f"{tar} | pigz -6 -n -c > {work}/peer.out"),
        "tar_gzip": shell(f"{tar} | gzip -6 -n -c > {work}/peer.out"),
        "sha256": sha,
    }
    subprocess.run(["sh", "-c", f"{tar} > {blob}"], check=True)
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for i in range(runs):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            start = time.perf_counter()
            variants[name]()
            times[name].append(time.perf_counter() - start)
    blob.unlink()
    res["tar_bytes"] = tar_bytes
    for name, ts in times.items():
        res[f"{name}_s"] = statistics.median(ts)
        res[f"{name}_MBps"] = tar_bytes / MB / res[f"{name}_s"]
    for ours, peer in (("envbuild_zstd", "tar_zstd"), ("envbuild_gzip", "tar_pigz")):
        ratios = [p / o for p, o in zip(times[peer], times[ours], strict=True)]
        res[f"{ours}_vs_{peer}_ratio_median"] = statistics.median(ratios)
        res[f"{ours}_vs_{peer}_ratio_range"] = [min(ratios), max(ratios)]
    res["load_after"] = os.getloadavg()
    shutil.rmtree(scratch_dir, ignore_errors=True)
    return res


# --- docker -----------------------------------------------------------------------------------


def bench_docker(spec: Path, work: Path, bump: tuple[str, str]) -> dict[str, Any]:
    from support.dockerd import private_dockerd

    res: dict[str, Any] = {}
    ctx = work / "docker-ctx"
    shutil.rmtree(ctx, ignore_errors=True)
    ctx.mkdir()
    (ctx / "envbuild-ca").mkdir()  # the Dockerfile COPYs it (empty: the base holds the CA)
    base_ctx = work / "docker-base"
    shutil.rmtree(base_ctx, ignore_errors=True)
    base_ctx.mkdir()
    ca = os.environ.get("SSL_CERT_FILE") or "/etc/ssl/certs/ca-certificates.crt"
    with private_dockerd() as host:
        env = {**os.environ, "DOCKER_HOST": host, "DOCKER_BUILDKIT": "0"}
        log("docker: a Debian bookworm minbase image as debian:bookworm (not timed)")
        rootfs = base_ctx / "rootfs.tar"
        run(
            [
                "mmdebstrap",
                "--variant=minbase",
                "--mode=root",
                "--format=tar",
                "bookworm",
                str(rootfs),
                "http://deb.debian.org/debian",
            ]
        )
        run(["docker", "import", str(rootfs), "debian:bookworm-plain"], env=env)
        shutil.copy(ca, base_ctx / "ca.pem")
        (base_ctx / "Dockerfile").write_text(
            "FROM debian:bookworm-plain\nCOPY ca.pem /etc/envbuild-ca.pem\n"
        )
        run(["docker", "build", "-q", "-t", "debian:bookworm", str(base_ctx)], env=env)
        build_args = ["--build-arg", "SSL_CERT_FILE=/etc/envbuild-ca.pem"]
        for var in ("HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY"):
            value = os.environ.get(var) or os.environ.get(var.lower())
            if value:
                build_args += ["--build-arg", f"{var}={value}"]

        def render(path: Path) -> None:
            loaded = load_spec(path)
            lock, lock_hash = planner.load_lock(loaded)
            text = render_dockerfile(loaded, lock, lock_hash=lock_hash, lock_file="lock").text
            (ctx / "Dockerfile").write_text(text)

        def docker_build(tag: str, *extra: str) -> tuple[float, str]:
            start = time.perf_counter()
            run(
                ["docker", "build", "--network", "host", *build_args, *extra, "-t", tag, str(ctx)],
                env=env,
            )
            took = time.perf_counter() - start
            ident = run(["docker", "image", "inspect", "-f", "{{.Id}}", tag], env=env).stdout
            return took, ident.strip()

        render(spec)
        cold = []
        for i in range(2):
            log(f"docker: cold build {i + 1}")
            took, ident = docker_build(f"bench:cold{i}", "--no-cache")
            cold.append({"seconds": took, "image_id": ident})
            log(f"docker: cold build {i + 1}: {took:.1f} s {ident[:19]}")
        res["cold"] = cold
        res["cold_same_id"] = len({c["image_id"] for c in cold}) == 1
        took, ident = docker_build("bench:cached")
        res["cached_noop_s"] = took
        log(f"docker: cached no-op {took:.2f} s")
        pkg, version = bump
        text = spec.read_text()
        spec.write_text(
            re.sub(rf'^{re.escape(pkg)} = "[^"]*"', f'{pkg} = "=={version}"', text, flags=re.M)
        )
        lock_spec(load_spec(spec))
        render(spec)
        took, ident = docker_build("bench:bumped")
        res["bump_s"] = took
        log(f"docker: bump {took:.1f} s")
        spec.write_text(text)
        lock_spec(load_spec(spec))
    return res


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/envbuild-bench-build"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--kimi", action="store_true", help="also build the real kimi-nvfp4 lock")
    ap.add_argument("--no-docker", action="store_true")
    args = ap.parse_args()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()},
        "command": "python3 " + " ".join(sys.argv),
    }
    out_file = work / "results.json"

    def save() -> None:
        results["machine"]["loadavg_now"] = os.getloadavg()
        out_file.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")

    bump = ("tqdm", "4.67.0")
    spec = make_repo(work, REPO / "bench" / "specs" / "cpu-stack.toml")
    results["cpu_stack"] = bench_envbuild(spec, work, args.runs, bump)
    save()
    tree, name = biggest_dist_tree(spec, Path(results["cpu_stack"]["store"]), work)
    log(f"packing: {name}")
    results["packing"] = {"layer": name, **bench_packing(tree, work, 3)}
    save()
    if args.kimi:
        try:
            kimi = make_repo(
                work,
                REPO / "specs" / "kimi-nvfp4.toml",
                lockfile=REPO / "lockfiles" / "pylock.kimi-nvfp4.toml",
            )
            results["kimi"] = bench_envbuild(kimi, work, args.runs, None, big=True)
            save()
            tree, name = biggest_dist_tree(kimi, Path(results["kimi"]["store"]), work)
            log(f"packing: {name}")
            results["packing_kimi"] = {"layer": name, **bench_packing(tree, work, 2)}
            save()
            shutil.rmtree(tree, ignore_errors=True)
            shutil.rmtree(results["kimi"]["store"], ignore_errors=True)  # 20 GB: free it
        except Exception as exc:  # keep the rest of the run
            log(f"kimi: failed: {exc!r}")
            results["kimi_error"] = repr(exc)
            save()
    if not args.no_docker:
        results["docker"] = bench_docker(spec, work, bump)
    results["machine"]["loadavg_end"] = os.getloadavg()
    save()
    print(json.dumps(results, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
