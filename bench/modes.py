"""What recording file modes costs a snapshot manifest: its Python environment part with and
without ``modes`` (per distribution) and ``mode`` (per added file), on real venvs.

    python3 bench/modes.py ~/.cache/envbuild-tests/{vllm-parser-0.33.0,torch-2.14.0,kimi-nvfp4}

Prints, per venv: distributions, files checked, the files listed with a mode other than their
distribution's usual one, the usual modes seen, and the environment's canonical JSON in bytes
without and with the modes (a quick check: both checks record the same modes).
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from envbuild.fsio import canonical_json
from envbuild.snapshot.pyenv import scan_env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("venvs", nargs="+")
    args = parser.parse_args()
    print("| venv | distributions | files | listed by mode | usual modes | bytes without | with |")
    print("|---|---:|---:|---:|---|---:|---:|")
    for venv in args.venvs:
        env = scan_env(venv, "quick")
        data = env.model_dump(mode="json")
        with_modes = len(canonical_json(data).encode())
        for dist in data["distributions"]:
            dist.pop("modes", None)
        for added in data["added"] or []:
            added.pop("mode", None)
        without = len(canonical_json(data).encode())
        listed = sum(len(p) for d in env.distributions if d.modes for p in d.modes.other.values())
        usual = collections.Counter(d.modes.usual for d in env.distributions if d.modes)
        files = sum(d.files for d in env.distributions)
        print(f"| {Path(venv).name} | {len(env.distributions)} | {files} | {listed} | "
              f"{', '.join(f'{m} x{n}' for m, n in sorted(usual.items()))} | {without} | "
              f"{with_modes} |")  # fmt: skip


if __name__ == "__main__":
    main()
