"""Compare two snapshots, or a snapshot and a build manifest, in the spirit of
``nix store diff-closures``: grouped, one line per thing that changed, sizes as deltas.

Each side is first reduced to *facts*: groups (host, GPUs, packages of one environment, files
modified since install …) of subject → text. Two sides differ where a subject's text differs.
Volatile facts (memory in use, free disk, GPU processes) sit in the ``state`` group, which is shown
but never makes the two sides "different". Groups only one side can have (a build manifest has no
host) are listed as not compared, with the reason.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from envbuild.errors import ManifestError
from envbuild.snapshot.jsonfile import read_json
from envbuild.snapshot.model import KIND, Snapshot, parse_snapshot
from envbuild.snapshot.model.gpu import Gpu
from envbuild.snapshot.model.pyenv import AddedFile, PythonEnv
from envbuild.snapshot.refs import check_build_manifest

ABSENT = "∅"


@dataclass(frozen=True)
class Fact:
    text: str
    size: int | None = None
    detail: str | None = None  # compared too, shown when the text is the same
    digest: str | None = None  # compared when both sides know it (a quick check may not)
    item: dict[str, Any] | None = field(default=None, compare=False)  # what it is, as fields
    data: dict[str, Any] | None = field(default=None, compare=False)  # its state, as fields


@dataclass(frozen=True)
class Change:
    subject: str
    before: str | None
    after: str | None
    delta_bytes: int | None = None
    item: dict[str, Any] | None = None  # e.g. kind, environment, path, distribution
    before_fields: dict[str, Any] | None = None  # e.g. status, sizes, sha256 on side a
    after_fields: dict[str, Any] | None = None


@dataclass
class Group:
    key: str
    title: str
    counts: bool = True
    changes: list[Change] = field(default_factory=list)


@dataclass
class DiffResult:
    a: str
    b: str
    groups: list[Group]
    not_compared: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # how the sides were paired, …

    @property
    def different(self) -> bool:
        return any(g.counts and g.changes for g in self.groups)

    def as_dict(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "different": self.different,
            "groups": [asdict(g) for g in self.groups if g.changes],
            "not_compared": self.not_compared,
            "notes": self.notes,
        }


@dataclass
class Side:
    """One input reduced to facts: group key → (title, counts, subject → fact)."""

    label: str
    kind: str  # "snapshot" or "build manifest"
    groups: dict[str, tuple[str, bool, dict[str, Fact]]] = field(default_factory=dict)

    def put(self, key: str, title: str, subject: str, fact: Fact, *, counts: bool = True) -> None:
        self.groups.setdefault(key, (title, counts, {}))[2][subject] = fact

    def group(self, key: str, title: str, *, counts: bool = True) -> None:
        self.groups.setdefault(key, (title, counts, {}))


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError  # pragma: no cover


def size_text(n: int) -> str:
    """Bytes as people read them (1.5 GiB), as every diff line shows them."""
    return _size(n)


def _count(value: int | None) -> str:
    return "n/a" if value is None else str(value)


def _flag(value: bool | None) -> str:
    return "n/a" if value is None else ("on" if value else "off")


# --- reducing a snapshot to facts ------------------------------------------------------------


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
    side.put(*state, "host memory", Fact(_size(h.memory_total_bytes)), counts=False)
    side.put(*state, "hostname", Fact(h.hostname), counts=False)
    for d in h.disks:
        side.put(*state, f"free disk {d.role} {d.path}", Fact(_size(d.free_bytes)), counts=False)

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
                f"{_size(card.memory_total_bytes)}, {card.uuid}"
            ),
        )
        side.put(
            *gpu,
            f"gpu{card.index} modes",
            Fact(
                f"persistence {_flag(card.persistence_mode)}, ECC {_flag(card.ecc_enabled)}, "
                f"MIG {_flag(card.mig_enabled)}, NVLinks {_count(card.nvlinks_active)}"
            ),
        )
        _gpu_config_facts(side, card)
        side.put(
            *state,
            f"gpu{card.index} memory used",
            Fact(_size(card.memory_used_bytes)),
            counts=False,
        )
        if card.memory_reserved_bytes is not None:
            side.put(
                *state,
                f"gpu{card.index} memory reserved by the driver",
                Fact(_size(card.memory_reserved_bytes)),
                counts=False,
            )
        for subject, text in _gpu_state_texts(card):
            side.put(*state, f"gpu{card.index} {subject}", Fact(text), counts=False)
        for p in card.processes:
            mem = _size(p.used_memory_bytes) if p.used_memory_bytes is not None else "?"
            side.put(
                *state,
                f"gpu{card.index} process {p.pid}",
                Fact(f"{p.name or '?'} ({p.unit or 'no unit'}), {mem}"),
                counts=False,
            )
    for link in g.topology:
        side.put(*gpu, f"gpu{link.a} ↔ gpu{link.b}", Fact(link.link))

    for env in snap.pythons:
        _env_facts(side, _env_key(env), env)

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
        _ref_facts(side, snap.image.manifest)
        if "image" not in side.groups.get("refs", ("", True, {}))[2]:
            side.put("refs", "spec, lock and image", "image", Fact(snap.image.manifest_sha256))
        _layer_facts(side, snap.image.manifest)
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
        "ECC pending": None if c.ecc_pending is None else _flag(c.ecc_pending),
        "MIG pending": None if c.mig_pending is None else _flag(c.mig_pending),
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
        "BAR1": None if c.bar1_total_bytes is None else _size(c.bar1_total_bytes),
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
    return f"gen {_count(gen)} x{_count(width)}"


def _yes(value: bool | None) -> str | None:
    return None if value is None else ("yes" if value else "no")


def _env_facts(side: Side, key: str, env: PythonEnv) -> None:
    pk, pt = f"packages {key}", f"packages ({env.requested})"
    side.put(pk, pt, "python", Fact(f"{env.implementation} {env.version}"))
    if env.torch_build is not None:
        t = env.torch_build
        text = f"torch {t.version}, CUDA {t.cuda or 'none'}" + (f", HIP {t.hip}" if t.hip else "")
        side.put(pk, pt, "torch build", Fact(text, detail=t.git_version))
    for d in env.distributions:
        side.put(
            pk,
            pt,
            d.name,
            Fact(
                d.version,
                size=d.size_bytes,
                detail=f"installer {d.installer}, RECORD {(d.record_sha256 or 'none')[:12]}",
                item={"kind": "package", "environment": key, "name": d.name},
                data={
                    "version": d.version,
                    "size": d.size_bytes,
                    "installer": d.installer,
                    "record_sha256": d.record_sha256,
                },
            ),
        )
    fk, ft = f"files {key}", f"files that differ from their RECORD ({env.requested})"
    side.group(fk, ft)

    def item(path: str, dist: str | None, **more: Any) -> dict[str, Any]:
        return {"kind": "file", "environment": key, "path": path, "distribution": dist, **more}

    for d in env.distributions:
        for m in d.modified:
            if m.reason == "size":
                text = f"differs from RECORD (size {m.expected_size} → {m.actual_size} B)"
            else:
                text = f"differs from RECORD (same size {m.actual_size} B, other bytes)"
            data = {"status": "modified", "reason": m.reason, "record_size": m.expected_size,
                    "size": m.actual_size, "sha256": m.sha256,
                    "written_after_record": m.written_after_record}  # fmt: skip
            side.put(
                fk,
                ft,
                f"{m.path} ({d.name})",
                Fact(text, digest=m.sha256, item=item(m.path, d.name), data=data),
            )
        for path in d.missing:
            side.put(
                fk,
                ft,
                f"{path} ({d.name})",
                Fact("missing", item=item(path, d.name), data={"status": "missing"}),
            )
    if env.added is not None:
        added = {a.path: a for a in env.added}
    else:  # an older snapshot: paths only
        added = {
            path: AddedFile(path=path, distribution=d.name, size=0, sha256=None)
            for d in env.distributions
            for path in d.unrecorded
        }
        added |= {p: AddedFile(path=p, distribution=None, size=0, sha256=None) for p in env.unowned}
    for a in added.values():
        data = {"status": "added", "size": a.size if env.added is not None else None,
                "sha256": a.sha256, "mode": a.mode}  # fmt: skip
        if a.distribution is not None:
            subject, text = f"{a.path} ({a.distribution})", "added (not in its RECORD)"
        elif a.folder_owners:
            subject = f"{a.path} (a folder of {' & '.join(a.folder_owners)})"
            text = "added (in no RECORD)"
        else:
            subject, text = f"{a.path} (no distribution)", "added (in no RECORD)"
        side.put(
            fk,
            ft,
            subject,
            Fact(
                text,
                digest=a.sha256,
                detail=None if a.mode is None else f"mode {a.mode}",  # a chmod of it is named
                item=item(a.path, a.distribution, folder_owners=a.folder_owners),
                data=data,
            ),
        )
    _mode_facts(side, key, env)
    if env.patches is not None:  # None: taken by an envbuild that did not record patches
        _patch_group(side, key, f"patches ({env.requested})")
        for name, rec in env.patches.items():
            _put_patches(side, key, f"patches ({env.requested})", name, rec.patches)
    ok, ot = f"overlaps {key}", f"paths owned by two distributions ({env.requested})"
    side.group(ok, ot)
    for o in env.overlaps:
        if not o.matches:
            disk = "matches neither"
        elif len(o.matches) == len(o.owners):
            disk = "the same bytes"
        else:
            disk = f"{' & '.join(o.matches)}'s bytes on disk"
        side.put(ok, ot, o.path, Fact(f"{' & '.join(o.owners)}; {disk}"))
    if env.links is not None:  # None: taken by an envbuild without the link check
        lk, lt = f"links {key}", f"files that will not load ({env.requested})"
        side.group(lk, lt)
        for f in env.links:
            what = ", ".join(f.demangled or f.missing[:5])
            more = f" and {len(f.missing) - 5} more" if len(f.missing) > 5 else ""
            note = "" if f.loaded else "; a plugin no import loads"
            side.put(
                lk,
                lt,
                f"{f.file.removeprefix(env.prefix + '/')} ({f.distribution or 'no distribution'})",
                Fact(f"needs {what}{more} ({f.cause}{note})", detail=" ".join(f.missing)),
            )


MODES = "modes "


def _mode_facts(side: Side, key: str, env: PythonEnv) -> None:
    """Each distribution's usual file mode (subject: its name) and each file with another mode
    (subject: path and distribution); :func:`_mode_changes` compares them. Distributions of an
    older snapshot have no modes: none are put, and none are compared."""
    title = f"files whose mode changed ({env.requested})"
    for d in env.distributions:
        if d.modes is None:
            continue
        side.put(MODES + key, title, d.name, Fact(d.modes.usual, item={"distribution": d.name}))
        for mode, paths in d.modes.other.items():
            for path in paths:
                item = {"kind": "file", "environment": key, "path": path, "distribution": d.name}
                side.put(MODES + key, title, f"{path} ({d.name})", Fact(mode, item=item))


def _mode_changes(
    group: Group, env: str, facts_a: dict[str, Fact], facts_b: dict[str, Fact], skip: set[str]
) -> None:
    """The files whose mode differs between the sides. A file neither side names has its
    distribution's usual mode on both; one side names it: the other's usual mode is its mode.
    Files missing or unrecorded on either side (``skip``, their paths) are not compared: a
    table names only the listed files found. Should the usual mode itself change (most of a
    distribution's files chmodded), the files no side names changed too: one change says so."""
    usual_a = {s: f.text for s, f in facts_a.items() if "path" not in (f.item or {})}
    usual_b = {s: f.text for s, f in facts_b.items() if "path" not in (f.item or {})}
    both = usual_a.keys() & usual_b.keys()
    for name in sorted(both):
        if usual_a[name] != usual_b[name]:
            group.changes.append(
                Change(
                    f"the other files of {name}",
                    f"mode {usual_a[name]}",
                    f"mode {usual_b[name]}",
                    item={"kind": "file modes", "environment": env, "distribution": name},
                    before_fields={"status": "mode", "mode": usual_a[name]},
                    after_fields={"status": "mode changed", "mode": usual_b[name]},
                )
            )
    for subject in sorted((facts_a.keys() | facts_b.keys()) - usual_a.keys() - usual_b.keys()):
        fa, fb = facts_a.get(subject), facts_b.get(subject)
        item = (fa or fb).item or {}  # type: ignore[union-attr]  # one side has it
        dist = str(item.get("distribution"))
        if dist not in both or item.get("path") in skip:
            continue
        before = fa.text if fa is not None else usual_a[dist]
        after = fb.text if fb is not None else usual_b[dist]
        if before != after:
            group.changes.append(
                Change(
                    subject,
                    f"mode {before}",
                    f"mode {after}",
                    item=item,
                    before_fields={"status": "mode", "mode": before},
                    after_fields={"status": "mode changed", "mode": after},
                )
            )


def _not_on_both(*groups: dict[str, Fact]) -> set[str]:
    """The paths of files a files group names as missing or added."""
    return {
        str(f.item["path"])
        for facts in groups
        for f in facts.values()
        if f.item and "path" in f.item and (f.data or {}).get("status") in ("missing", "added")
    }


# --- patches ---------------------------------------------------------------------------------


def _patch_group(side: Side, env_key: str, title: str) -> None:
    side.group(f"patches {env_key}", title)


def _put_patches(side: Side, env_key: str, title: str, dist: str, patches: Any) -> None:
    """One distribution's patches as a fact: each patch's path and the head of its sha256 in
    the text, the full digests in the detail (compared, shown when the text is the same)."""
    from packaging.utils import canonicalize_name

    items = [(str(_get(p, "path")), str(_get(p, "sha256"))) for p in patches]
    text = ", ".join(f"{path} (sha256 {digest[:16]})" for path, digest in items)
    detail = ", ".join(f"{path} sha256:{digest}" for path, digest in items)
    side.put(
        f"patches {env_key}", title, canonicalize_name(dist), Fact(text or "none", detail=detail)
    )


def _get(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def _manifest_patch_facts(side: Side, data: dict[str, Any]) -> None:
    """A build manifest's ``patches`` (one record per patched distribution, see
    :class:`envbuild.build.manifest.PatchRecord`); a manifest from before patches has no such
    key."""
    records = data.get("patches")
    if not isinstance(records, list):
        return
    title = "patches (build manifest)"
    _patch_group(side, "image", title)
    for rec in records:
        if isinstance(rec, dict) and isinstance(rec.get("dist"), str):
            patches = [p for p in rec.get("patches") or [] if isinstance(p, dict)]
            _put_patches(side, "image", title, rec["dist"], patches)


# --- reducing a build manifest to facts ------------------------------------------------------


def _packages_of(data: dict[str, Any]) -> dict[str, tuple[str, int | None]] | None:
    layers = data.get("layers")
    if "packages" not in data and isinstance(layers, list):
        # envbuild's build manifest: each layer lists the name==version it holds
        found: dict[str, tuple[str, int | None]] = {}
        for layer in layers:
            for item in layer.get("distributions", []) if isinstance(layer, dict) else []:
                name, sep, version = str(item).partition("==")
                if sep:
                    found[name] = (version, None)
        if found:
            return found
    for holder in (data, data.get("python"), data.get("lock")):
        if not isinstance(holder, dict) or "packages" not in holder:
            continue
        pkgs = holder["packages"]
        if isinstance(pkgs, dict):
            return {str(k): (str(v), None) for k, v in pkgs.items()}
        if isinstance(pkgs, list):
            out = {}
            for p in pkgs:
                if isinstance(p, dict) and "name" in p and "version" in p:
                    size = p.get("size") if isinstance(p.get("size"), int) else None
                    out[str(p["name"])] = (str(p["version"]), size)
            return out
    return None


def _ref_facts(side: Side, data: dict[str, Any]) -> None:
    """What a build manifest says it was built from, and the image's digest."""
    title = "spec, lock and image"
    if isinstance(data.get("spec"), str) and isinstance(data.get("spec_hash"), str):
        side.put("refs", title, "spec", Fact(f"{data['spec']} {data['spec_hash'][:16]}"))
    if isinstance(data.get("lock_hash"), str):
        side.put("refs", title, "lock", Fact(data["lock_hash"]))
    if isinstance(data.get("image"), str):
        side.put("refs", title, "image", Fact(data["image"]))


def _layer_facts(side: Side, data: dict[str, Any]) -> None:
    layers = data.get("layers")
    if not isinstance(layers, list):
        return
    side.group("layers", "image layers")
    for i, layer in enumerate(layers):
        if isinstance(layer, dict):
            name = str(layer.get("name") or layer.get("id") or f"layer {i}")
            digest = str(layer.get("digest") or layer.get("diff_id") or "?")
            size = layer.get("size") if isinstance(layer.get("size"), int) else None
        else:
            name, digest, size = f"layer {i}", str(layer), None
        side.put("layers", "image layers", name, Fact(digest, size=size))


def build_manifest_facts(data: dict[str, Any], label: str) -> Side:
    from packaging.utils import canonicalize_name

    side = Side(label, "build manifest")
    pkgs = _packages_of(data)
    if pkgs is not None:
        pk, pt = "packages image", "packages (build manifest)"
        side.group(pk, pt)
        for name, (version, size) in pkgs.items():
            side.put(pk, pt, canonicalize_name(name), Fact(version, size=size))
        python = data.get("python_version") or (data.get("python") or {}).get("version")
        if isinstance(python, str):
            side.put(pk, pt, "python", Fact(f"cpython {python}"))
    if pkgs is not None:
        _manifest_patch_facts(side, data)
    _layer_facts(side, data)
    _ref_facts(side, data)
    if not side.groups:
        raise ManifestError(
            f"{label}: neither a snapshot nor a build manifest with packages or layers",
            hint="pass a file written by `envbuild snapshot` or `envbuild build`",
        )
    return side


def load_side(path: Path) -> tuple[Side, Snapshot | None]:
    data = read_json(path)
    if isinstance(data, dict) and ("kind" in data or ("schema_version" in data and "host" in data)):
        if data.get("kind") != KIND and "host" not in data:
            raise ManifestError(f"{path}: unknown manifest kind {data.get('kind')!r}")
        snap = parse_snapshot(data, str(path))
        return snapshot_facts(snap, str(path)), snap
    if not isinstance(data, dict):
        raise ManifestError(f"{path}: expected a JSON object")
    check_build_manifest(data, str(path))
    return build_manifest_facts(data, str(path)), None


# --- comparing -------------------------------------------------------------------------------


def _pair_envs(a: Side, b: Side) -> list[str]:
    """Python environments are matched by the path asked for; when exactly one environment on
    each side is left unmatched (two machines, or a snapshot and a build manifest), they pair,
    and the note returned says so."""
    prefixes = ("packages ", "patches ", "files ", MODES, "overlaps ", "links ")
    a_envs = {k.removeprefix("packages ") for k in a.groups if k.startswith("packages ")}
    b_envs = {k.removeprefix("packages ") for k in b.groups if k.startswith("packages ")}
    only_a, only_b = a_envs - b_envs, b_envs - a_envs
    if len(only_a) != 1 or len(only_b) != 1:
        return []
    old, new = only_b.pop(), only_a.pop()
    for p in prefixes:
        if p + old in b.groups:
            title, counts, facts = b.groups.pop(p + old)
            a_title = a.groups.get(p + new, (title,))[0]
            b.groups[p + new] = (
                a_title if a_title == title else a_title.replace(")", f" ↔ {old})", 1),
                counts,
                facts,
            )
    if a.kind == "build manifest" or b.kind == "build manifest":
        return []  # a build manifest names no path: nothing to say
    return [
        f"the Python environments are at different paths: {new} in {a.label}, {old} in "
        f"{b.label}; compared with each other"
    ]


def compare(a: Side, b: Side) -> DiffResult:
    notes = _pair_envs(a, b)
    result = DiffResult(a.label, b.label, [], notes=notes)
    envs = Group("environments", "Python environments")
    result.groups.append(envs)
    skipped: dict[str, list[str]] = {}
    for key in sorted(set(a.groups) | set(b.groups), key=_group_order):
        if key not in a.groups or key not in b.groups:
            missing, present = (a, b) if key not in a.groups else (b, a)
            title, _, facts = present.groups[key]
            if missing.kind == "build manifest" or key == "state":
                skipped.setdefault(f"{missing.label} ({missing.kind}) has none", []).append(title)
            elif key.startswith("packages "):
                python = facts.get("python")  # a build manifest need not say its Python
                count = len(set(facts) - {"python", "torch build"})
                shown = f"{python.text + ', ' if python else ''}{count} distributions"
                env = key.removeprefix("packages ")
                before, after = (None, shown) if missing is a else (shown, None)
                envs.changes.append(Change(env, before, after))
            elif key.startswith("patches ") and f"packages {key[8:]}" not in missing.groups:
                pass  # the whole environment is missing: shown under environments
            elif key.startswith(("links ", MODES)) and f"packages {key[6:]}" not in missing.groups:
                pass
            elif not key.startswith(("files ", "overlaps ")):
                skipped.setdefault(f"not recorded in {missing.label}", []).append(title)
            continue
        title, counts, facts_a = a.groups[key]
        facts_b = b.groups[key][2]
        group = Group(key, title, counts)
        result.groups.append(group)
        if key.startswith(MODES):
            env = key.removeprefix(MODES)
            files = [side.groups.get(f"files {env}", ("", True, {}))[2] for side in (a, b)]
            _mode_changes(group, env, facts_a, facts_b, _not_on_both(*files))
            continue
        for subject in sorted(set(facts_a) | set(facts_b)):
            fa, fb = facts_a.get(subject), facts_b.get(subject)
            if fa == fb or (key in ("refs", GPU_CONFIG[0]) and None in (fa, fb)):
                continue  # (a reference or setting one side did not record is unknown)
            if fa is not None and fb is not None and fa.text == fb.text:
                if fa.digest and fb.digest and fa.digest != fb.digest:
                    # the same finding, other bytes: a second edit of a drifted file
                    before = f"{fa.text}, sha256 {fa.digest[:12]}"
                    after = f"{fb.text}, sha256 {fb.digest[:12]}"
                    if fa.detail and fb.detail and fa.detail != fb.detail:  # e.g. its mode
                        before, after = f"{before}, {fa.detail}", f"{after}, {fb.detail}"
                elif None in (fa.detail, fb.detail) or fa.detail == fb.detail:
                    continue  # only the size moved: not a change of what is there
                else:
                    before, after = fa.detail, fb.detail
            elif (
                subject in ("python", "torch build")
                and key.startswith("packages ")
                and "build manifest" in (a.kind, b.kind)
            ):
                continue  # a build manifest that does not say its Python or torch build
            elif subject == "torch build" and None in (fa, fb) and key.startswith("packages "):
                continue  # an older snapshot did not record it: unknown, not changed
            else:
                before = fa.text if fa else None
                after = fb.text if fb else None
            delta = None
            sized = [f.size for f in (fa, fb) if f is not None]
            if None not in sized:  # a side that does not know its size gives no delta
                delta = ((fb.size or 0) if fb else 0) - ((fa.size or 0) if fa else 0)
            group.changes.append(
                Change(
                    subject,
                    before,
                    after,
                    delta or None,
                    item=fa.item if fa is not None else fb.item if fb is not None else None,
                    before_fields=fa.data if fa is not None else None,
                    after_fields=fb.data if fb is not None else None,
                )
            )
    result.groups.sort(key=lambda g: _group_order(g.key))
    result.not_compared = [f"{'; '.join(titles)}: {why}" for why, titles in skipped.items()]
    return result


_ORDER = (
    "host",
    "gpu",
    "cuda",
    "environments",
    "packages",
    "patches",
    "files",
    "modes",
    "overlaps",
    "links",
    "containers",
    "services",
    "models",
    "refs",
    "layers",
    "state",
)


def _group_order(key: str) -> tuple[int, str]:
    head = key.split(" ", 1)[0]
    return (_ORDER.index(head) if head in _ORDER else len(_ORDER), key)


def diff_files(a: Path, b: Path) -> DiffResult:
    side_a, _ = load_side(a)
    side_b, _ = load_side(b)
    return compare(side_a, side_b)


def render_text(result: DiffResult, *, only_counted: bool = False) -> list[str]:
    lines: list[str] = []
    for group in result.groups:
        if not group.changes or (only_counted and not group.counts):
            continue
        lines.append(f"{group.title}:")
        for c in group.changes:
            text = f"  {c.subject}: {c.before or ABSENT} → {c.after or ABSENT}"
            if c.delta_bytes:
                sign = "+" if c.delta_bytes > 0 else "-"
                text += f", {sign}{_size(abs(c.delta_bytes))}"
            lines.append(text)
    for note in result.notes:
        lines.append(f"note: {note}")
    for note in result.not_compared:
        lines.append(f"not compared: {note}")
    return lines
