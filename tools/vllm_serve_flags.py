#!/usr/bin/env python3
"""Extract ``vllm serve``'s flags from a vLLM wheel into envbuild's knowledge base.

    tools/vllm_serve_flags.py venv DEST --vllm 0.33.0 --lock lockfiles/pylock.kimi-nvfp4.toml \
        [--torch 'torch==2.13.0+cpu'] [--wheels DIR]
    tools/vllm_serve_flags.py table --python DEST/bin/python -o envbuild/spec/vllm_serve/0.33.0.toml
    tools/vllm_serve_flags.py gguf-venv DEST2 --parser DEST --lock lockfiles/pylock.glm5-gguf.toml

``venv`` makes a venv that can build vLLM's argument parser without a GPU: the vLLM wheel from
PyPI (``pip download --no-deps vllm==X``) installed without its dependencies, plus the lock's
pure-Python and small native dependencies at their locked versions (the GPU libraries, kernels
and torch's CUDA build are left out) and a CPU torch (``--torch``: any pip requirement or wheel
path; vLLM's modules import torch while the parser is built). The vllm-gguf-plugin wheel is
fetched too and its entry points recorded: it adds no serve flags (it registers a model loader
and a quantization config when the engine starts).

``table`` runs :mod:`envbuild.apply.vllm_probe` (vLLM's own parser, built the way ``vllm serve``
builds it) in that venv and writes the TOML table: every flag's names, whether it takes a value,
its choices, its config group, and which ones the spec owns (the unit already passes them from
[serve] / [model]). Rerun both for every vLLM release a spec pins.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import tomli_w

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "envbuild" / "apply" / "vllm_probe.py"

#: Locked distributions the parser does not need: GPU libraries, kernels, CUDA torch and its kin.
LEAVE_OUT = re.compile(
    r"^(torch|torch[a-z-]+|nvidia-.*|cuda-.*|triton|tokenspeed-.*|flashinfer-python|tilelang|"
    r"vllm|vllm-gguf-plugin|nccl.*|humming-kernels|quack-kernels|instanttensor|pynvvideocodec|"
    r"fastsafetensors|z3-solver|llvmlite|numba|opencv-python-headless|ninja|flash-attn)$"
)

#: What the spec owns: flags the unit passes itself (envbuild/apply/unit.py ``exec_start``),
#: by the parser's ``dest``, with the spec key to set instead.
OWNED = {
    "model": "model.repo",
    "revision": "model.revision",
    "tokenizer": "model.tokenizer",
    "tokenizer_revision": "model.tokenizer.revision",
    "code_revision": "model.revision",
    "hf_config_path": "model.config",
    "tensor_parallel_size": "serve.tensor_parallel_size",
    "pipeline_parallel_size": "serve.pipeline_parallel_size",
    "max_model_len": "serve.max_model_len",
    "kv_cache_dtype": "serve.kv_cache_dtype",
    "gpu_memory_utilization": "serve.gpu_memory_utilization",
    "served_model_name": "serve.served_model_name",
    "host": "serve.host",
    "port": "serve.port",
}


def _pip(python: Path, *args: str) -> None:
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", *args], check=True)


def _download(req: str, dest: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", req, "-d", str(dest)],
        check=True,
    )
    name = re.split(r"[=<>!~ ]", req, maxsplit=1)[0].replace("-", "_")
    return next(p for p in sorted(dest.glob("*.whl")) if p.name.lower().startswith(name + "-"))


def make_venv(dest: Path, vllm: str, gguf: str, lock: Path, torch: str, wheels: Path) -> None:
    wheels.mkdir(parents=True, exist_ok=True)
    wheel = _download(f"vllm=={vllm}", wheels)
    plugin = _download(f"vllm-gguf-plugin=={gguf}", wheels)
    subprocess.run([sys.executable, "-m", "venv", str(dest)], check=True)
    python = dest / "bin" / "python"
    locked = tomllib.loads(lock.read_text(encoding="utf-8"))["packages"]
    reqs = [f"{p['name']}=={p['version']}" for p in locked if not LEAVE_OUT.match(p["name"])]
    _pip(python, str(wheel), torch, *reqs)
    (dest / "vllm-wheel.json").write_text(
        json.dumps(
            {
                "name": wheel.name,
                "sha256": _sha256(wheel),
                "plugin": {"name": plugin.name, "sha256": _sha256(plugin)},
            },
            sort_keys=True,
        )
        + "\n"
    )


#: What gguf-venv adds to the parser venv, from the lock: the plugin and what it imports that
#: the parser venv leaves out.
GGUF_PACKAGES = ("vllm-gguf-plugin", "gguf", "triton")


def gguf_venv(dest: Path, parser: Path, lock: Path) -> None:
    """A venv over the parser venv (a .pth names its site-packages) with the lock's
    vllm-gguf-plugin, gguf and triton, installed without dependencies by their locked sha256."""
    locked = {p["name"]: p for p in tomllib.loads(lock.read_text(encoding="utf-8"))["packages"]}
    lines = []
    for name in GGUF_PACKAGES:
        pkg = locked[name]
        hashes = " ".join(f"--hash=sha256:{w['hashes']['sha256']}" for w in pkg["wheels"])
        lines.append(f"{name}=={pkg['version']} {hashes}")
    subprocess.run([sys.executable, "-m", "venv", str(dest)], check=True)
    python = dest / "bin" / "python"
    with tempfile.TemporaryDirectory() as tmp:
        reqs = Path(tmp) / "requirements.txt"
        reqs.write_text("\n".join(lines) + "\n")
        _pip(python, "--require-hashes", "-r", str(reqs))
    [site] = (dest / "lib").glob("python3*/site-packages")
    [under] = (parser / "lib").glob("python3*/site-packages")
    (site / "vllm-parser.pth").write_text(f"{under.resolve()}\n")


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def probe(python: Path, *args: str) -> dict[str, object]:
    out = subprocess.run(
        [str(python), "-I", str(PROBE), *args], check=True, capture_output=True, text=True
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def table(python: Path) -> dict[str, object]:
    dumped = probe(python, "dump")
    wheel = json.loads((python.parent.parent / "vllm-wheel.json").read_text())
    version = dumped["vllm"]
    where = f"{wheel['name']} (sha256 {wheel['sha256']})"
    flags = []
    for flag in dumped["flags"]:  # type: ignore[attr-defined]
        group = flag["group"] or "options"
        entry = {
            "names": flag["names"],
            "dest": flag["dest"],
            "takes_value": flag["takes_value"],
            "source": f"vllm serve's parser in {wheel['name']}, group {group}",
        }
        if flag["choices"] is not None:
            entry["choices"] = flag["choices"]
        if flag["nargs"] is not None:
            entry["nargs"] = flag["nargs"]
        if flag["dest"] in OWNED:
            entry["owned_by"] = OWNED[flag["dest"]]
        flags.append(entry)
    flags.sort(key=lambda f: f["names"][0])
    registries = "ToolParserManager.list_registered() / ReasoningParserManager.list_registered()"
    data: dict[str, object] = {
        "vllm": version,
        "source": f"extracted by tools/vllm_serve_flags.py from {where}",
        "value_checks": [
            {
                "dest": "tool_call_parser",
                "choices": dumped["tool_call_parsers"],
                "unless": "tool_parser_plugin",
                "source": f"{registries} in {where} (checked by validate_api_server_args)",
            },
            {
                "dest": "reasoning_parser",
                "choices": dumped["reasoning_parsers"],
                "unless": "reasoning_parser_plugin",
                "source": f"{registries} in {where} (checked by validate_api_server_args)",
            },
        ],
        "flags": flags,
    }
    if plugin := wheel.get("plugin"):
        data["plugins"] = [
            {
                "name": "vllm-gguf-plugin",
                "serve_flags": [],
                "source": f"{plugin['name']} (sha256 {plugin['sha256']}): vllm_gguf_plugin/"
                "plugin.py register() patches EngineArgs.create_model_config and registers a "
                "model loader and a quantization config at engine start; it adds no serve flag",
            }
        ]
    return data


HEADER = (
    "# Generated by tools/vllm_serve_flags.py from the vLLM wheel; do not edit.\n"
    "# Regenerate: tools/vllm_serve_flags.py venv DIR --vllm V --lock L && "
    "tools/vllm_serve_flags.py table --python DIR/bin/python -o THIS_FILE\n"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("venv", help="a venv that can build vLLM's parser (no GPU)")
    v.add_argument("dest", type=Path)
    v.add_argument("--vllm", required=True)
    v.add_argument("--gguf-plugin", default="0.0.5", help="the vllm-gguf-plugin to inspect")
    v.add_argument("--lock", type=Path, required=True, help="a lock that pins this vLLM")
    v.add_argument("--torch", default="torch==2.13.0+cpu", help="a CPU torch (requirement/path)")
    v.add_argument("--wheels", type=Path, help="where to keep the downloaded wheels")
    g = sub.add_parser("gguf-venv", help="the lock's vllm-gguf-plugin over a parser venv")
    g.add_argument("dest", type=Path)
    g.add_argument("--parser", type=Path, required=True, help="the venv `venv` made")
    g.add_argument("--lock", type=Path, required=True, help="a lock with vllm-gguf-plugin")
    t = sub.add_parser("table", help="write the flag table from a parser venv")
    t.add_argument("--python", type=Path, required=True)
    t.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args()
    if args.cmd == "venv":
        with tempfile.TemporaryDirectory() as tmp:
            make_venv(
                args.dest,
                args.vllm,
                args.gguf_plugin,
                args.lock,
                args.torch,
                args.wheels or Path(tmp),
            )
        return 0
    if args.cmd == "gguf-venv":
        gguf_venv(args.dest, args.parser, args.lock)
        return 0
    data = table(args.python)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(HEADER + tomli_w.dumps(data), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
