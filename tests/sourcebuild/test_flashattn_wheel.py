"""The real flash-attn wheel, when a store holds it (opt-in: CI never builds flash-attn).

``bench/flashattn.py build`` makes it (hours on 2 cores) in
``~/.cache/envbuild/bench-flash-attn-store``, or ``$ENVBUILD_FLASH_ATTN_STORE``; this test finds
it there under the key glm5-gguf's build has on this machine and skips when it is absent. It
checks what a user relies on: the audit finds SASS for sm_120 and nothing else, and the wheel,
installed into a venv beside the lock's torch, imports on a machine without a GPU
(``flash_attn_2_cuda`` loads its CUDA libraries; no kernel runs)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from envbuild.lock.core import lock_path
from envbuild.lock.io import read_lock
from envbuild.proc.core import find_uv
from envbuild.sourcebuild.audit import audit_wheel
from envbuild.sourcebuild.builder import HostBuilder
from envbuild.sourcebuild.inputs import inputs_of
from envbuild.sourcebuild.requests import KIND, build_requests
from envbuild.sourcebuild.toolchain import find_cuobjdump, find_nvcc
from envbuild.spec.load import load_spec
from envbuild.store.core import Store, derivation_key

REPO = Path(__file__).resolve().parents[2]
STORE = Path(
    os.environ.get("ENVBUILD_FLASH_ATTN_STORE")
    or Path.home() / ".cache" / "envbuild" / "bench-flash-attn-store"
)

pytestmark = [pytest.mark.slow, pytest.mark.network]


@pytest.fixture(scope="module")
def built() -> tuple[Path, str, list[str]]:
    """(the stored wheel's blob, its file name, the lock's pins of torch's closure)."""
    if not STORE.is_dir() or find_nvcc(required=False) is None:
        pytest.skip(f"no flash-attn build store at {STORE} (bench/flashattn.py build makes it)")
    loaded = load_spec(REPO / "specs" / "glm5-gguf.toml")
    lock = read_lock(lock_path(loaded))
    (req,) = build_requests(loaded, lock)
    einops = lock.package("einops")  # flash-attn's other requirement, as the lock pins it
    pins = [*req.constraints, *([f"einops=={einops.version}"] if einops else [])]
    builder = HostBuilder(loaded.spec.python.version)
    key = derivation_key(KIND, inputs_of(req, builder.probe(cuda=True), builder))
    drv = Store(STORE).lookup(key)
    if drv is None:
        pytest.skip(f"{STORE} holds no flash-attn build {key[:12]} (not finished yet?)")
    return Store(STORE).blob_path(drv.outputs["wheel"]), str(drv.meta["wheel"]), pins


def test_the_wheel_holds_sass_for_sm_120_only(built: tuple[Path, str, list[str]]) -> None:
    blob, name, _ = built
    audit = audit_wheel(blob)
    assert audit.sass == ["sm_120"] and audit.ptx == []
    assert [f.lto for f in audit.files] == [[]]  # one compiled file, no LTO-IR either
    if cuobjdump := find_cuobjdump():  # NVIDIA's own reader agrees
        assert audit_wheel(blob, tool=cuobjdump).sass == ["sm_120"]
    assert name.startswith("flash_attn-2.8.3.post2-cp311-cp311-linux_x86_64")


def test_the_wheel_imports_beside_the_locked_torch(
    built: tuple[Path, str, list[str]], tmp_path: Path
) -> None:
    blob, name, constraints = built
    wheel = tmp_path / name
    shutil.copyfile(blob, wheel)
    (tmp_path / "constraints.txt").write_text("\n".join(constraints) + "\n")
    uv, venv = find_uv(), tmp_path / "venv"
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    subprocess.run([uv, "venv", "-q", "--python", "3.11", str(venv)], check=True, env=env)
    python = str(venv / "bin" / "python")
    subprocess.run(
        [uv, "pip", "install", "-q", "--python", python, "--constraint",
         str(tmp_path / "constraints.txt"), "torch", "einops", str(wheel)],
        check=True, env=env,
    )  # fmt: skip
    code = (
        "import flash_attn, flash_attn_2_cuda; from flash_attn import flash_attn_func; "
        "print(flash_attn.__version__, flash_attn_func.__name__)"
    )
    done = subprocess.run(
        [python, "-c", code], check=False, capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2.8.3.post2", "flash_attn_func"]
