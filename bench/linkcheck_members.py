"""Where the CPU of the build's cold link check goes: each ELF member of the image's wheels read
once, in this one process, in steps timed apart (user and system CPU seconds of each).

    python3 bench/linkcheck_members.py --store S [--heap]

The wheels and what their layers leave out are the store's ``links`` derivation's inputs (a
built store). Steps: the compressed bytes read from the zip, inflated by zlib and by ISA-L,
CRC-32 by zlib and by ISA-L, sha256, and the ELF reader (pyelftools). ``--heap`` first has
glibc keep its heap (:func:`envbuild.linkcheck.zipread.keep_heap`), as the workers do. Prints
JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import struct
import sys
import zipfile
import zlib
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from isal import isal_zlib

from envbuild.installed.venv import VenvTarget
from envbuild.linkcheck.elf import BadElf, read_elf
from envbuild.linkcheck.wheels import _members
from envbuild.linkcheck.zipread import keep_heap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--heap", action="store_true")
    args = ap.parse_args()
    if args.heap:
        keep_heap()
    drvs = [json.loads(p.read_text()) for p in sorted((args.store / "drv").glob("*.json"))]
    inputs = next(d["inputs"] for d in drvs if d.get("kind") == "links")
    target = VenvTarget(**inputs["target"])
    # the dists' names are not in the inputs: leaves are matched on the paths instead
    left = {p for paths in inputs["leaves_out"].values() for p in paths}
    cpu: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    count = inflated = packed = 0

    def timed(step: str, fn, *a):  # type: ignore[no-untyped-def]
        start = os.times()
        out = fn(*a)
        end = os.times()
        cpu[step][0] += end.user - start.user
        cpu[step][1] += end.system - start.system
        return out

    for sha in inputs["wheels"]:
        path = args.store / "blobs" / "sha256" / sha
        with open(path, "rb") as f, zipfile.ZipFile(f) as zf:
            for _, member, _, elf in _members(zf, target, frozenset(left), records=False):
                info = zf.getinfo(member)
                if not elf or info.compress_type not in (0, 8):
                    continue
                f.seek(info.header_offset)
                names, extra = struct.unpack("<26xHH", f.read(30))
                f.seek(info.header_offset + 30 + names + extra)
                raw = timed("zip read", f.read, info.compress_size)
                if info.compress_type == 8:
                    timed("inflate zlib", zlib.decompress, raw, -15, info.file_size)
                    data = timed("inflate isal", isal_zlib.decompress, raw, -15, info.file_size)
                else:
                    data = raw
                del raw
                timed("crc32 zlib", zlib.crc32, data)
                timed("crc32 isal", isal_zlib.crc32, data)
                timed("sha256", lambda d: hashlib.sha256(d).hexdigest(), data)
                with contextlib.suppress(BadElf):
                    timed("elf read", read_elf, io.BytesIO(data))
                count += 1
                inflated += info.file_size
                packed += info.compress_size
    print(
        json.dumps(
            {
                "members": count,
                "inflated_gb": round(inflated / 1e9, 3),
                "compressed_gb": round(packed / 1e9, 3),
                "heap_kept": args.heap,
                "cpu_s": {
                    k: {"user": round(u, 2), "sys": round(s, 2)} for k, (u, s) in cpu.items()
                },
                "loadavg": os.getloadavg(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
