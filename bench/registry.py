"""Bytes uploaded for a second experiment that shares torch with the first: `envbuild push` of two
envbuild images against `docker push` of the same two images built by `docker build`.

    python3 bench/registry.py                       # torch==2.5.1 (with its CUDA wheels)
    python3 bench/registry.py --shared numpy==2.2.1 # a quick run with a small shared package
    python3 bench/registry.py --work /var/tmp/bench --keep --json out.json

Two specs are written into a scratch project: experiment A = Debian bookworm + python3 +
SHARED + rich, experiment B = the same + requests instead of rich. Both are locked with
`envbuild lock` (PyPI) and then:

* envbuild: `envbuild build` both into one store (each big distribution is its own layer, so
  torch and each CUDA library are layers A and B share), then `envbuild push` A and B to a
  fresh loopback registry (Debian's docker-registry);
* docker: `envbuild dockerfile` renders each spec's Dockerfile, `docker build` (classic builder,
  on a private dockerd with the vfs driver, host network, `debian:bookworm` made with mmdebstrap
  and `docker import`) builds it, `docker push` pushes A and B to a second fresh registry.

What was uploaded is read from each registry's access log (every `PUT …/blobs/uploads/…?digest=`
answered 201), the sizes from its storage: the same measure for both tools. Needs: network to
PyPI and the Debian mirror, docker-registry, skopeo, dockerd, mmdebstrap, zstd; about 40 GB of
disk for torch (vfs keeps a full copy of the root file system per image layer).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from support.dockerd import private_dockerd  # noqa: E402
from support.registry import Registry, run_registry  # noqa: E402

SPEC = """\
description = "registry benchmark, experiment {name}"

[base]
kind = "debian"
suite = "bookworm"
variant = "minbase"
packages = ["ca-certificates", "python3"]

[python]
version = "3.11"
platform = "manylinux_2_36_x86_64"

[packages]
{packages}

[image]
cmd = ["python3", "-c", "print('experiment {name}')"]

[resolution]
exclude_newer = 2025-01-15T00:00:00Z
"""
CA_IN_IMAGE = "/etc/envbuild-bench-ca.pem"


def envbuild(*args: str | Path, cwd: Path, env: dict[str, str]) -> str:
    argv = [sys.executable, "-m", "envbuild", *map(str, args)]
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"envbuild {' '.join(map(str, args))} failed:\n{done.stderr}")
    return done.stdout


def uploaded(reg: Registry, since: int) -> tuple[int, int]:
    """(blobs, bytes) the registry received since ``since``."""
    digests = sorted(set(reg.uploads(since)))
    return len(digests), sum(reg.blob_file(d).stat().st_size for d in digests)


def write_specs(repo: Path, shared: list[str]) -> dict[str, Path]:
    (repo / ".git").mkdir(parents=True, exist_ok=True)
    (repo / "specs").mkdir(exist_ok=True)
    own = {"a": ["rich==13.9.4"], "b": ["requests==2.32.3"]}
    specs = {}
    for name, extra in own.items():
        lines = []
        for req in [*shared, *extra]:
            dist, _, version = req.partition("==")
            lines.append(f'{dist} = "=={version}"' if version else f'{dist} = ""')
        path = repo / "specs" / f"exp-{name}.toml"
        path.write_text(SPEC.format(name=name, packages="\n".join(lines)))
        specs[name] = path
    return specs


def bench_envbuild(
    repo: Path, specs: dict[str, Path], work: Path, env: dict[str, str]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    store = work / "store"
    for name, spec in specs.items():
        start = time.perf_counter()
        built = json.loads(envbuild("build", spec, "--store", store, "--json", cwd=repo, env=env))
        out[f"build_{name}_s"] = round(time.perf_counter() - start, 1)
        out[f"layers_{name}"] = len(built["layers"])
    with run_registry(work / "registry-envbuild") as reg:
        for name in specs:
            mark = reg.log_mark()
            start = time.perf_counter()
            result = json.loads(
                envbuild(
                    "push",
                    repo / "images" / f"exp-{name}" / "oci",
                    reg.ref("bench/exp", name),
                    "--insecure",
                    "--json",
                    cwd=repo,
                    env=env,
                )
            )
            out[f"push_{name}_s"] = round(time.perf_counter() - start, 1)
            out[f"push_{name}_blobs"], out[f"push_{name}_bytes"] = uploaded(reg, mark)
            out[f"push_{name}_reported_bytes"] = result["bytes_uploaded"]
            out[f"push_{name}_reported_skipped"] = result["skipped"]
            out[f"image_{name}_bytes"] = result["bytes_uploaded"] + result["bytes_skipped"]
    return out


def debian_image(docker: list[str], work: Path, env: dict[str, str]) -> None:
    """``debian:bookworm`` for the Dockerfiles' FROM: mmdebstrap minbase, imported, plus the CA
    bundle this machine's HTTPS proxy needs (passed to pip and uv as SSL_CERT_FILE)."""
    tar = work / "bookworm.tar"
    if not tar.exists():
        subprocess.run(
            ["mmdebstrap", "--variant=minbase", "--quiet", "bookworm", str(tar)], check=True
        )
    subprocess.run(
        [*docker, "import", str(tar), "envbuild-bench/bookworm-raw"],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    ctx = work / "ca-context"
    ctx.mkdir(exist_ok=True)
    ca = os.environ.get("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt")
    shutil.copy(ca, ctx / "ca.pem")
    (ctx / "Dockerfile").write_text(
        f"FROM envbuild-bench/bookworm-raw\nCOPY ca.pem {CA_IN_IMAGE}\n"
    )
    subprocess.run(
        [*docker, "build", "-q", "-t", "debian:bookworm", str(ctx)],
        check=True,
        env={**env, "DOCKER_BUILDKIT": "0"},
        stdout=subprocess.DEVNULL,
    )


def bench_docker(
    repo: Path, specs: dict[str, Path], work: Path, env: dict[str, str]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    (work / "dockerd").mkdir(exist_ok=True)
    with private_dockerd(work / "dockerd") as host, run_registry(work / "registry-docker") as reg:
        denv = {
            **env,
            "DOCKER_HOST": host,
            "DOCKER_BUILDKIT": "0",
            "DOCKER_CONFIG": str(work / "docker-config"),
        }
        docker = ["docker"]
        debian_image(docker, work, denv)
        for name, spec in specs.items():
            ctx = work / f"docker-{name}"
            ctx.mkdir(exist_ok=True)
            envbuild("dockerfile", spec, "-o", ctx / "Dockerfile", cwd=repo, env=env)
            tag = reg.ref("bench/exp", name)
            start = time.perf_counter()
            subprocess.run(
                [
                    *docker,
                    "build",
                    "--network",
                    "host",
                    "-t",
                    tag,
                    "--build-arg",
                    f"SSL_CERT_FILE={CA_IN_IMAGE}",
                    str(ctx),
                ],
                check=True,
                env=denv,
                stdout=subprocess.DEVNULL,
            )
            out[f"build_{name}_s"] = round(time.perf_counter() - start, 1)
            mark = reg.log_mark()
            start = time.perf_counter()
            subprocess.run([*docker, "push", tag], check=True, env=denv, stdout=subprocess.DEVNULL)
            out[f"push_{name}_s"] = round(time.perf_counter() - start, 1)
            out[f"push_{name}_blobs"], out[f"push_{name}_bytes"] = uploaded(reg, mark)
            inspect = subprocess.run(
                [*docker, "image", "inspect", "--format", "{{len .RootFS.Layers}}", tag],
                check=True,
                env=denv,
                capture_output=True,
                text=True,
            )
            out[f"layers_{name}"] = int(inspect.stdout.strip())
    _unmount_leftovers(work / "dockerd")
    return out


def _unmount_leftovers(folder: Path) -> None:
    """dockerd leaves its default network namespace mounted under exec/netns; unmount it so the
    scratch folder can be removed."""
    for ns in sorted((folder / "exec" / "netns").glob("*")):
        subprocess.run(["umount", str(ns)], check=False, capture_output=True)
    shutil.rmtree(folder, ignore_errors=True)


def mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def report(shared: list[str], results: dict[str, dict[str, Any]]) -> str:
    e, d = results["envbuild"], results["docker"]
    lines = [
        f"Shared by A and B: {', '.join(shared)}; A adds rich, B adds requests.",
        "",
        "| tool | layers (A / B) | push A: uploaded | push B: uploaded | push B: blobs |",
        "|---|---:|---:|---:|---:|",
        f"| envbuild build + envbuild push | {e['layers_a']} / {e['layers_b']} | "
        f"{mb(e['push_a_bytes'])} | {mb(e['push_b_bytes'])} | {e['push_b_blobs']} |",
        f"| docker build + docker push | {d['layers_a']} / {d['layers_b']} | "
        f"{mb(d['push_a_bytes'])} | {mb(d['push_b_bytes'])} | {d['push_b_blobs']} |",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shared",
        nargs="+",
        default=["torch==2.5.1"],
        help="requirements both experiments share (default: torch==2.5.1)",
    )
    parser.add_argument("--work", type=Path, help="scratch folder (default: a new one in /var/tmp)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    parser.add_argument("--only", choices=("envbuild", "docker"), help="run one side only")
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="envbuild-bench-registry-", dir="/var/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    repo = work / "repo"
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "ENVBUILD_STORE": str(work / "store")}
    results: dict[str, dict[str, Any]] = {}
    try:
        specs = write_specs(repo, args.shared)
        for spec in specs.values():
            envbuild("lock", spec, cwd=repo, env=env)
        if args.only != "docker":
            results["envbuild"] = bench_envbuild(repo, specs, work, env)
            print("envbuild:", json.dumps(results["envbuild"]), flush=True)
        if args.only != "envbuild":
            results["docker"] = bench_docker(repo, specs, work, env)
            print("docker:", json.dumps(results["docker"]), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps({"shared": args.shared, **results}, indent=2) + "\n")
    if len(results) == 2:
        print(report(args.shared, results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
