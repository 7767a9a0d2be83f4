#!/usr/bin/env python3
"""One build of a spec, in-process, with its stages timed (``BuildResult.timings``), which the
CLI does not print (not a test).

    python3 bench/stages.py specs/kimi-nvfp4.toml --store S --output O           # as it is
    python3 bench/stages.py specs/kimi-nvfp4.toml --store S --output O --redo links
    python3 bench/stages.py specs/kimi-nvfp4.toml --store S --output O --redo layers --redo links

``--redo links`` first forgets the store's link-check derivation (its ``drv/<key>.json``, kind
``links``; the report blob stays), so the ``links`` stage checks the image again: cold when
``$XDG_CACHE_HOME/envbuild/linkcheck`` is empty, warm when it holds an earlier check's facts.
``--redo layers`` forgets the layer derivations (kind ``layer``; their blobs stay), so every
layer is installed and packed again, as in a cold build whose wheels are in the store.
The wall time covers ``envbuild.pipeline.core.build`` only (imports and spec loading excluded).
Prints
JSON: the wall time, the stages, what was rebuilt, the image digest and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from envbuild.pipeline import core as build  # noqa: E402
from envbuild.spec import load_spec  # noqa: E402
from envbuild.store.core import Store  # noqa: E402

#: What ``--redo`` names: the derivation kind it forgets.
KINDS = {"links": "links", "layers": "layer"}


def forget(store: Path, kind: str) -> list[str]:
    """Remove the derivations of ``kind`` from ``store`` (their outputs stay as blobs)."""
    gone = []
    for path in sorted((store / "drv").glob("*.json")):
        if json.loads(path.read_text()).get("kind") == kind:
            path.unlink()
            gone.append(path.stem)
    return gone


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("spec", type=Path)
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--output", type=Path, required=True)
    ap.add_argument("--redo", choices=sorted(KINDS), action="append", default=[])
    ap.add_argument("--no-docker-archive", dest="docker_archive", action="store_false")
    args = ap.parse_args()
    forgotten = [key for redo in args.redo for key in forget(args.store, KINDS[redo])]
    loaded = load_spec(args.spec)
    load0 = os.getloadavg()
    start = time.perf_counter()
    result = build.build(
        loaded, store=Store(args.store), output=args.output, docker_archive=args.docker_archive
    )
    wall = time.perf_counter() - start
    assert result.manifest is not None
    print(
        json.dumps(
            {
                "spec": str(args.spec),
                "forgotten": forgotten,
                "wall_s": round(wall, 4),
                "timings_s": {k: round(v, 4) for k, v in result.timings.items()},
                "rebuilt": sorted(result.rebuilt),
                "image": result.manifest.image,
                "loadavg_before": load0,
                "loadavg_after": os.getloadavg(),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
