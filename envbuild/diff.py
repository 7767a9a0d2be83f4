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
from envbuild.snapshot.model import KIND, PythonEnv, Snapshot, parse_snapshot, read_json
from envbuild.snapshot.refs import check_build_manifest

ABSENT = "∅"


@dataclass(frozen=True)
class Fact:
    text: str
    size: int | None = None
    detail: str | None = None  # compared too, shown when the text is the same


@dataclass(frozen=True)
class Change:
    subject: str
    before: str | None
    after: str | None
    delta_bytes: int | None = None


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
    side.put(*host, "memory", Fact(_size(h.memory_total_bytes)))
    state = ("state", "state (volatile: shown, not counted)")
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
        side.put(
            *state,
            f"gpu{card.index} memory used",
            Fact(_size(card.memory_used_bytes)),
            counts=False,
        )
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


def _env_facts(side: Side, key: str, env: PythonEnv) -> None:
    pk, pt = f"packages {key}", f"packages ({env.requested})"
    side.put(pk, pt, "python", Fact(f"{env.implementation} {env.version}"))
    for d in env.distributions:
        side.put(
            pk,
            pt,
            d.name,
            Fact(
                d.version,
                size=d.size_bytes,
                detail=f"installer {d.installer}, RECORD {(d.record_sha256 or 'none')[:12]}",
            ),
        )
    fk, ft = f"files {key}", f"files changed since install ({env.requested})"
    side.group(fk, ft)
    for d in env.distributions:
        for m in d.modified:
            side.put(
                fk,
                ft,
                f"{m.path} ({d.name})",
                Fact(f"modified ({m.reason}, {m.expected_size} → {m.actual_size} B)"),
            )
        for path in d.missing:
            side.put(fk, ft, f"{path} ({d.name})", Fact("missing"))
        for path in d.unrecorded:
            side.put(fk, ft, f"{path} ({d.name})", Fact("added (not in RECORD)"))
    for path in env.unowned:
        side.put(fk, ft, f"{path} (no distribution)", Fact("added (not in any RECORD)"))
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
    :class:`envbuild.manifest.PatchRecord`); a manifest from before patches has no such key."""
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


def _pair_envs(a: Side, b: Side) -> None:
    """Python environments are matched by the path asked for; when exactly one environment on
    each side is left unmatched (two machines, or a snapshot and a build manifest), they pair."""
    prefixes = ("packages ", "patches ", "files ", "overlaps ")
    a_envs = {k.removeprefix("packages ") for k in a.groups if k.startswith("packages ")}
    b_envs = {k.removeprefix("packages ") for k in b.groups if k.startswith("packages ")}
    only_a, only_b = a_envs - b_envs, b_envs - a_envs
    if len(only_a) == 1 and len(only_b) == 1:
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


def compare(a: Side, b: Side) -> DiffResult:
    _pair_envs(a, b)
    result = DiffResult(a.label, b.label, [])
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
                count = len(facts) - (python is not None)
                shown = f"{python.text + ', ' if python else ''}{count} distributions"
                env = key.removeprefix("packages ")
                before, after = (None, shown) if missing is a else (shown, None)
                envs.changes.append(Change(env, before, after))
            elif key.startswith("patches ") and f"packages {key[8:]}" not in missing.groups:
                pass  # the whole environment is missing: shown under environments
            elif not key.startswith(("files ", "overlaps ")):
                skipped.setdefault(f"not recorded in {missing.label}", []).append(title)
            continue
        title, counts, facts_a = a.groups[key]
        facts_b = b.groups[key][2]
        group = Group(key, title, counts)
        for subject in sorted(set(facts_a) | set(facts_b)):
            fa, fb = facts_a.get(subject), facts_b.get(subject)
            if fa == fb or (key == "refs" and None in (fa, fb)):
                continue  # (a reference one side did not record is unknown, not absent)
            if fa is not None and fb is not None and fa.text == fb.text:
                if None in (fa.detail, fb.detail) or fa.detail == fb.detail:
                    continue  # only the size moved: not a change of what is there
                before, after = fa.detail, fb.detail
            elif (
                subject == "python"
                and key.startswith("packages ")
                and "build manifest" in (a.kind, b.kind)
            ):
                continue  # a build manifest that does not say its Python
            else:
                before = fa.text if fa else None
                after = fb.text if fb else None
            delta = None
            sized = [f.size for f in (fa, fb) if f is not None]
            if None not in sized:  # a side that does not know its size gives no delta
                delta = ((fb.size or 0) if fb else 0) - ((fa.size or 0) if fa else 0)
            group.changes.append(Change(subject, before, after, delta or None))
        result.groups.append(group)
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
    "overlaps",
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
    for note in result.not_compared:
        lines.append(f"not compared: {note}")
    return lines
