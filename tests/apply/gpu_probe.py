"""Not a pytest module: run it by hand on a machine with an NVIDIA GPU and torch, from the
repository root (``python3 tests/apply/gpu_probe.py``). It exercises the real SystemProbe (NVML
through the snapshot stage, /proc, nvcc) and a preflight of an H200 spec while a torch process
holds 4 GiB of GPU memory, and prints what they found.

Seen on one H200 (driver 580.159.04, 2026-11-29): the GPU as "NVIDIA H200", the torch process
with its pid, "python3", 4.5 GiB and no unit; nvcc 13.0; preflight exit 2 with the driver
(fit), the process outside any unit and the disk reported together."""

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.getcwd())

from envbuild.apply.paths import Paths
from envbuild.apply.preflight import PreflightInput, run_preflight
from envbuild.apply.probe import SystemProbe
from envbuild.spec.model import Spec

holder = subprocess.Popen(
    [
        sys.executable,
        "-c",
        "import torch,time; x=torch.empty(4<<30, dtype=torch.uint8, "
        "device='cuda'); print('held', flush=True); time.sleep(300)",
    ],
    stdout=subprocess.PIPE,
    text=True,
)
print("holder:", holder.stdout.readline().strip(), "pid", holder.pid)
probe = SystemProbe()
print("driver:", probe.driver_version())
print("gpus:", probe.gpus())
print("processes:", probe.gpu_processes())
print("toolkit:", probe.cuda_toolkit())
spec = Spec.model_validate(
    {
        "name": "h200-probe",
        "host": {"driver": "590.48.01", "gpus": [{"model": "H200", "count": 1}]},
        "base": {"kind": "debian"},
        "python": {"version": "3.12"},
        "model": {"repo": "org/m", "revision": "a" * 40, "size_gb": 595.0},
        "serve": {"tensor_parallel_size": 1},
        "resolution": {"exclude_newer": "2026-01-01T00:00:00Z"},
    },
    strict=False,
)
report = run_preflight(
    probe,
    Paths(Path("/tmp/envbuild-root")),
    PreflightInput(
        spec=spec,
        unit="envbuild-h200-probe.service",
        keep_units=frozenset(),
        running_units=[],
        builds_missing={"flash-attn": True},
        secrets_missing=[],
        python=sys.executable,
        agreed=False,
        can_start=False,
        services_note="no systemd here",
    ),
)
print(json.dumps(report.as_dict(), indent=1))
holder.kill()
