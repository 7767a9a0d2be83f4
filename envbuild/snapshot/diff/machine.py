"""A snapshot reduced to facts: host, driver and GPUs (their configuration is drift, their state
is not), CUDA, containers, services, models and what the snapshot was taken against; each Python
environment through :mod:`.envfacts`."""

from __future__ import annotations

import logging

from envbuild.snapshot.diff.envfacts import env_facts
from envbuild.snapshot.diff.facts import Fact, Side, count_text, flag_text, size_text
from envbuild.snapshot.diff.manifest import layer_facts, ref_facts, setid_facts
from envbuild.snapshot.model.core import Snapshot
from envbuild.snapshot.model.gpu import Gpu
from envbuild.snapshot.model.pyenv import PythonEnv

log = logging.getLogger(__name__)


def _env_key(env: PythonEnv) -> str:
    return env.requested


def snapshot_facts(snap: Snapshot, label: str) -> Side:
    side = Side(label, "snapshot")
    h = snap.host
    host = ("host", "host")
    side.put(*host, "os", Fact(h.os.pretty_name or f"{h.os.id} {h.os.version_id}"))
    side.put(*host, "kernel", Fact(h.kernel))
    side.put(*host, "arch", Fact(h.arch))
    side.put(*host, "cpu", Fact(f"{h.cpu_model or '?'}, {h.logical_cpus} logical CPUs"))
    state = ("state", "state (volatile: shown, not counted)")
    # on some VMs the memory the kernel sees grows as it is used: state, not drift
    side.put(*state, "host memory", Fact(size_text(h.memory_total_bytes)), counts=False)
    side.put(*state, "hostname", Fact(h.hostname), counts=False)
    for d in h.disks:
        side.put(
            *state, f"free disk {d.role} {d.path}", Fact(size_text(d.free_bytes)), counts=False
        )

    g = snap.gpu
    gpu = ("gpu", "driver, CUDA and GPUs")
    side.put(*gpu, "NVML", Fact("available" if g.available else f"not available ({g.reason})"))
    if g.available:
        side.put(*gpu, "driver", Fact(g.driver_version or "?"))
        side.put(*gpu, "CUDA driver API", Fact(g.cuda_driver_version or "?"))
    for card in g.gpus:
        side.put(
            *gpu,
            f"gpu{card.index}",
            Fact(
                f"{card.name}, cc {card.compute_capability}, "
                f"{size_text(card.memory_total_bytes)}, {card.uuid}"
            ),
        )
        side.put(
            *gpu,
            f"gpu{card.index} modes",
            Fact(
                f"persistence {flag_text(card.persistence_mode)}, "
                f"ECC {flag_text(card.ecc_enabled)}, "
                f"MIG {flag_text(card.mig_enabled)}, NVLinks {count_text(card.nvlinks_active)}"
            ),
        )
        _gpu_config_facts(side, card)
        side.put(
            *state,
            f"gpu{card.index} memory used",
            Fact(size_text(card.memory_used_bytes)),
            counts=False,
        )
        if card.memory_reserved_bytes is not None:
            side.put(
                *state,
                f"gpu{card.index} memory reserved by the driver",
                Fact(size_text(card.memory_reserved_bytes)),
                counts=False,
            )
        for subject, text in _gpu_state_texts(card):
            side.put(*state, f"gpu{card.index} {subject}", Fact(text), counts=False)
        for p in card.processes:
            mem = size_text(p.used_memory_bytes) if p.used_memory_bytes is not None else "?"
            side.put(
                *state,
                f"gpu{card.index} process {p.pid}",
                Fact(f"{p.name or '?'} ({p.unit or 'no unit'}), {mem}"),
                counts=False,
            )
    for link in g.topology:
        side.put(*gpu, f"gpu{link.a} ↔ gpu{link.b}", Fact(link.link))

    for env in snap.pythons:
        env_facts(side, _env_key(env), env)

    side.group("cuda", "CUDA toolkits")
    for t in snap.cuda_toolkits:
        side.put("cuda", "CUDA toolkits", t.path, Fact(t.version, detail=t.build))
    if snap.cuda_libraries is not None:  # None: an older snapshot, not compared
        side.group("cuda libraries", "CUDA libraries (system)")
        for lib in snap.cuda_libraries:
            side.put("cuda libraries", "CUDA libraries (system)", lib.path,
                     Fact(f"{lib.name} {lib.version}"))  # fmt: skip
    if snap.docker is not None:
        side.group("containers", "containers")
        if not snap.docker.available:
            side.put("containers", "containers", "engine", Fact("not available"))
        for c in snap.docker.containers:
            digest = ", ".join(c.repo_digests) or c.image_id
            side.put("containers", "containers", c.name, Fact(f"{c.image} ({digest}), {c.status}"))
    if snap.systemd is not None:
        key = f"services {snap.systemd.pattern}"
        side.group(key, f"services ({snap.systemd.pattern})")
        title = f"services ({snap.systemd.pattern})"
        if not snap.systemd.available:
            side.put(key, title, "systemd", Fact("not available"))
        for u in snap.systemd.units:
            side.put(
                key, title, u.unit, Fact(f"{u.active_state}/{u.sub_state}, {u.unit_file_state}")
            )
            side.put(key, title, f"{u.unit} ExecStart", Fact(" ".join(u.exec_start)))
            for name, value in sorted(u.environment.items()):
                side.put(key, title, f"{u.unit} {name}", Fact(value))
    if snap.hf_cache is not None:
        key = "models"
        side.group(key, "models (Hugging Face cache)")
        for r in snap.hf_cache.repos:
            revs = ", ".join(
                f"{rev.commit[:12]}" + (f" ({', '.join(rev.refs)})" if rev.refs else "")
                for rev in r.revisions
            )
            side.put(
                key,
                "models (Hugging Face cache)",
                f"{r.repo_type} {r.repo_id}",
                Fact(revs or "no revisions", size=r.size_bytes),
            )
            for b in r.bad_blobs:
                side.put(
                    key,
                    "models (Hugging Face cache)",
                    f"{r.repo_id} blob {b.blob[:16]}",
                    Fact(f"content does not match its name ({', '.join(b.files)})"),
                )
    if snap.image is not None:  # what the image says it was built from ...
        ref_facts(side, snap.image.manifest)
        if "image" not in side.groups.get("refs", ("", True, {}))[2]:
            side.put("refs", "spec, lock and image", "image", Fact(snap.image.manifest_sha256))
        layer_facts(side, snap.image.manifest)
        setid_facts(side, snap.image.manifest)
    if snap.spec is not None:  # ... unless a spec was named
        side.put(
            "refs",
            "spec, lock and image",
            "spec",
            Fact(f"{snap.spec.name} {snap.spec.spec_hash[:16]}"),
        )
        side.put("refs", "spec, lock and image", "lock", Fact(snap.spec.lock_sha256 or "none"))
    return side


GPU_CONFIG = ("gpu config", "GPU configuration")


def _gpu_config_facts(side: Side, card: Gpu) -> None:
    """One fact per configuration field NVML answered. A field one side does not have (an older
    snapshot, a GPU that does not support it) is unknown there, not changed."""
    c = card.config
    texts: dict[str, str | None] = {
        "serial": c.serial,
        "board part number": c.board_part_number,
        "VBIOS": c.vbios_version,
        "InfoROM": c.inforom_version,
        "compute mode": c.compute_mode,
        "ECC pending": None if c.ecc_pending is None else flag_text(c.ecc_pending),
        "MIG pending": None if c.mig_pending is None else flag_text(c.mig_pending),
        "virtualization": c.virtualization_mode,
        "power limit": _watts(c.power_limit_w),
        "power limit default/max": (
            None
            if c.power_limit_default_w is None
            else f"{_watts(c.power_limit_default_w)} / {_watts(c.power_limit_max_w)}"
        ),
        "max clocks": _clocks(c.max_clocks_mhz),
        "application clocks": _clocks(c.application_clocks_mhz),
        "PCIe max": _pcie(c.pcie_max_generation, c.pcie_max_width),
        "PCIe width": None if c.pcie_width is None else f"x{c.pcie_width}",
        "BAR1": None if c.bar1_total_bytes is None else size_text(c.bar1_total_bytes),
        "NUMA node": None if c.numa_node is None else str(c.numa_node),
        "CPU affinity": c.cpu_affinity,
        "row remapping pending": _yes(c.remapped_rows_pending),
        "row remapping failed": _yes(c.remapped_rows_failure),
        "retired pages pending": _yes(c.retired_pages_pending),
    }
    for subject, text in texts.items():
        if text is not None:
            item = {"kind": "gpu setting", "gpu": card.index, "uuid": card.uuid, "name": subject}
            side.put(*GPU_CONFIG, f"gpu{card.index} {subject}", Fact(text, item=item))


def _gpu_state_texts(card: Gpu) -> list[tuple[str, str]]:
    s = card.state
    out = [
        ("performance state", s.performance_state),
        ("temperature", None if s.temperature_c is None else f"{s.temperature_c} C"),
        ("power draw", _watts(s.power_draw_w)),
        (
            "utilization",
            None
            if s.utilization_gpu_percent is None
            else f"GPU {s.utilization_gpu_percent} %, memory {s.utilization_memory_percent} %",
        ),
        ("clocks", _clocks(s.clocks_mhz)),
        ("clocks limited by", ", ".join(s.clocks_event_reasons) or None),
        ("PCIe generation", None if s.pcie_generation is None else f"gen {s.pcie_generation}"),
        ("ECC errors", ", ".join(f"{k} {v}" for k, v in sorted(s.ecc_errors.items())) or None),
        (
            "remapped rows",
            None
            if s.remapped_rows_correctable is None
            else f"{s.remapped_rows_correctable} correctable, "
            f"{s.remapped_rows_uncorrectable} uncorrectable",
        ),
    ]
    return [(subject, text) for subject, text in out if text is not None]


def _watts(value: float | None) -> str | None:
    return None if value is None else f"{value:g} W"


def _clocks(clocks: dict[str, int]) -> str | None:
    return ", ".join(f"{k} {v} MHz" for k, v in sorted(clocks.items())) or None


def _pcie(gen: int | None, width: int | None) -> str | None:
    if gen is None and width is None:
        return None
    return f"gen {count_text(gen)} x{count_text(width)}"


def _yes(value: bool | None) -> str | None:
    return None if value is None else ("yes" if value else "no")
