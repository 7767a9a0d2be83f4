"""An offline serving VM still gets the whole preflight: ``apply --dry-run`` of glm5-gguf (a
flash-attn source build and a vLLM patch, whose store keys need the locked wheels'
dependencies) runs in a network namespace of its own (``unshare -rn``: no route anywhere, not
even DNS) with an empty cache, and prints every check. The lock recorded what keying the
builds needs at lock time (``tool.envbuild.requires``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent

pytestmark = pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare")


def test_an_offline_dry_run_prints_the_whole_preflight(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(tmp_path / "cache"),  # no wheel METADATA cached from before
        "HF_HUB_OFFLINE": "",
        "ENVBUILD_STORE": str(tmp_path / "store"),
    }
    argv = ["unshare", "-rn", sys.executable, "-m", "envbuild", "apply"]
    argv += [str(REPO / "specs" / "glm5-gguf.toml"), "--dry-run", "--json"]
    argv += ["--root", str(tmp_path / "root")]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, check=False)
    assert done.returncode in (2, 3), done.stderr  # this machine is not the spec's
    out = json.loads(done.stdout)
    assert "error" not in out, out
    names = [c["name"] for c in out["preflight"]["checks"]]
    for name in ("driver", "model-revision", "vllm-args", "disk", "toolkit", "python"):
        assert name in names, (name, names)
    checks = {c["name"]: c for c in out["preflight"]["checks"]}
    assert "flash-attn" in checks["toolkit"]["message"]  # keyed, not in the store: a build
    # and so the same dry run reached nothing: a lock without the record could not key the build
    assert "network" not in done.stderr.lower(), done.stderr
