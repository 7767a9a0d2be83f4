"""The machine as spec tables: ``[host]``, ``[cuda]``, ``[base]`` and ``[python]`` from a snapshot.

Input: a :class:`~envbuild.snapshot.model.core.Snapshot` (NVML's driver and GPUs, the CUDA toolkits,
``/etc/os-release``) and the adopted environment. Output: the tables as plain data, and notes
for what could not be said (a GPU the knowledge base does not know is left out and named: the
spec must validate).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from envbuild.snapshot.model.core import Snapshot
from envbuild.snapshot.model.pyenv import PythonEnv
from envbuild.spec import knowledge
from envbuild.spec.facts import knowledge as facts_of

DEFAULT_SUITE = "bookworm"


def host_table(snap: Snapshot, notes: list[str]) -> dict[str, Any] | None:
    """``[host]``: the driver and each kind of GPU (model, count, compute capability), or None
    when NVML saw no GPU."""
    section = snap.gpu
    if not section.available or not section.driver_version or not section.gpus:
        notes.append(f"no [host]: NVML saw no GPU ({section.reason or 'no GPUs'})")
        return None
    kinds: Counter[tuple[str, str]] = Counter((g.name, g.compute_capability) for g in section.gpus)
    gpus: list[dict[str, Any]] = []
    for (name, cc), count in sorted(kinds.items()):
        fact = knowledge.gpu(name)
        if fact is None:
            notes.append(
                f"GPU {name!r} (compute capability {cc}) is not in the knowledge base: left out "
                "of [host.gpus] (add it to envbuild/spec/knowledge.toml)"
            )
            continue
        gpus.append({"model": fact.name, "count": count, "compute_capability": cc})
    if not gpus:
        return None
    return {"driver": section.driver_version, "gpus": gpus}


def cuda_table(snap: Snapshot, notes: list[str]) -> dict[str, Any] | None:
    """``[cuda]``: the toolkit source builds used, when exactly one nvcc version is on the
    machine (``source = "host"``)."""
    versions = sorted({t.version for t in snap.cuda_toolkits})
    if len(versions) != 1:
        if versions:
            notes.append(f"no [cuda]: several CUDA toolkits ({', '.join(versions)})")
        return None
    parts = versions[0].split(".")
    version = ".".join(parts[:2]) if len(parts) > 2 and parts[2] == "0" else versions[0]
    return {"version": version, "source": "host"}


def base_table(snap: Snapshot, notes: list[str]) -> dict[str, Any]:
    """``[base]``: the Debian suite of this machine, when it is one the knowledge base knows."""
    os_info = snap.host.os
    for fact in facts_of().debian:
        if os_info.id == "debian" and os_info.version_id == fact.version:
            return {"kind": "debian", "suite": fact.suite}
    notes.append(
        f"[base]: this machine is {os_info.pretty_name or os_info.id or 'unknown'}, not a Debian "
        f"suite envbuild knows; the spec says debian {DEFAULT_SUITE} (edit [base] for an image)"
    )
    return {"kind": "debian", "suite": DEFAULT_SUITE}


def python_table(env: PythonEnv, base: dict[str, Any]) -> dict[str, Any]:
    """``[python]``: the environment's MAJOR.MINOR; its interpreter when the base's python3 is
    another version (the image then needs that interpreter)."""
    version = ".".join(env.version.split(".")[:2])
    table: dict[str, Any] = {"version": version}
    suite = knowledge.debian(str(base.get("suite")))
    if suite is not None and suite.python != version:
        table["interpreter"] = f"/usr/bin/python{version}"
    return table
