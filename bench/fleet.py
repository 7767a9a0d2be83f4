"""A fleet's second VM: `envbuild apply --image` on a first VM (empty store) and a second one
(the store shared), against `docker pull` of the same image from the same registry, one run.

    python3 bench/fleet.py [--mb 48] [--small 6] [--work DIR] [--json out.json]

A scratch project (the tests' tiny rootfs base, ``support.project``) locks wheels made here of
incompressible bytes: one big distribution of ``--mb`` MB (a layer of its own) and ``--small``
distributions of ``--mb / 8`` MB each (the group layers). `envbuild build --compression gzip`
(docker 20.10 pulls no zstd layers) builds the image and `envbuild push` pushes it to a fresh
loopback registry (Debian's docker-registry). Then, each a whole process:

* VM 1: `envbuild apply SPEC --image REG/REPO@sha256:… --root R1` with an empty store;
* VM 2: the same into `--root R2`, the store shared (another VM with the store on a shared disk,
  or the same VM's second root);
* `docker pull REG/REPO@sha256:…` on a private dockerd (``--storage-driver=vfs
  --iptables=false --bridge=none``, as the tests start it), its image store empty.

Both applies run with PyPI behind a proxy that refuses and ``UV_OFFLINE=1``. The blobs each
fetched come from the registry's access log; wall seconds from a monotonic clock, CPU seconds
(envbuild's, from ``wait4``: docker pull's work is dockerd's, so none is given for it), the
1-minute load average at the start and end of each.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from support.dockerd import private_dockerd  # noqa: E402
from support.project import write_project  # noqa: E402
from support.registry import run_registry  # noqa: E402
from support.wheels import make_wheel, ref  # noqa: E402
from wholeproc import load, run_once  # noqa: E402


def envbuild(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    before = load()
    got = run_once([str(a) for a in argv], REPO, env)
    if got["code"] != 0:
        raise SystemExit(f"envbuild {' '.join(map(str, argv))} failed:\n{got['stderr'][-3000:]}")
    return {"wall": round(got["wall"], 2), "cpu": round(got["cpu"], 2),
            "load": [round(before, 2), round(load(), 2)]}  # fmt: skip


def project(work: Path, mb: int, small: int) -> Path:
    repo = work / "project"
    (repo / ".git").mkdir(parents=True)
    (repo / "specs").mkdir()
    d = repo / "wheels"

    def blob(n: int, seed: str) -> bytes:
        return os.urandom(n) if n else seed.encode()

    wheels = [ref(make_wheel(d, "bigpkg", "1.0", {"bigpkg/data.bin": blob(mb << 20, "big")}))]
    for i in range(small):
        files = {f"small{i}/data.bin": blob((mb << 20) // 8, str(i)), f"small{i}/__init__.py": ""}
        wheels.append(ref(make_wheel(d, f"small{i}", "1.0", files)))
    return write_project(repo, "fleet", wheels)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=48)
    ap.add_argument("--small", type=int, default=6)
    ap.add_argument("--work", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-fleet-", dir="/var/tmp"))
    spec = project(work, args.mb, args.small)
    with run_registry(work / "registry") as reg, private_dockerd() as docker_host:
        base_env = {"ENVBUILD_STORE": str(work / "ci-store")}
        out = work / "out"
        envbuild(["build", "--compression", "gzip", "--store", work / "ci-store",
                  "--output", out, spec], base_env)  # fmt: skip
        envbuild(["push", out, reg.ref("fleet/img", "fleet"), "--insecure"], base_env)
        manifest = json.loads((out / "build-manifest.json").read_text())
        image = f"{reg.host}/fleet/img@{manifest['image']}"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            refused = f"http://127.0.0.1:{s.getsockname()[1]}"
        vm_env = {
            "ENVBUILD_STORE": str(work / "vm-store"),
            "HTTPS_PROXY": refused, "HTTP_PROXY": refused, "NO_PROXY": "127.0.0.1,localhost",
            "UV_OFFLINE": "1",
        }  # fmt: skip
        sizes = [x["size"] for x in manifest["layers"]]
        rows: dict[str, Any] = {"image": image, "layers": len(sizes), "image_bytes": sum(sizes)}
        for name in ("vm1", "vm2"):
            mark = reg.log_mark()
            root = work / name
            root.mkdir()
            got = envbuild(["apply", spec, "--image", image, "--insecure", "--root", root], vm_env)
            got["blobs"] = len(reg.blob_gets(mark))
            rows[name] = got
        mark = reg.log_mark()
        before = load()
        start = time.perf_counter()
        subprocess.run(["docker", "-H", docker_host, "pull", "-q", image], check=True,
                       capture_output=True)  # fmt: skip
        rows["docker_pull"] = {
            "wall": round(time.perf_counter() - start, 2),
            "load": [round(before, 2), round(load(), 2)],
            "blobs": len(reg.blob_gets(mark)),
        }
    print(json.dumps(rows, indent=2))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
