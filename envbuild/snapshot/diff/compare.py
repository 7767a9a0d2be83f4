"""Comparing two sides: environments paired, each group's facts compared subject by subject (a
fact one side did not record is unknown, not changed), file modes compared against each
distribution's usual mode, and the result as :class:`DiffResult`."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from envbuild.errors import ManifestError
from envbuild.snapshot.contents import counted
from envbuild.snapshot.diff.envfacts import MODES
from envbuild.snapshot.diff.facts import ABSENT, Fact, Side
from envbuild.snapshot.diff.machine import GPU_CONFIG, snapshot_facts
from envbuild.snapshot.diff.manifest import build_manifest_facts
from envbuild.snapshot.diff.same import Contents, contents, same_mode
from envbuild.snapshot.jsonfile import read_json
from envbuild.snapshot.model.core import KIND, Snapshot, parse_snapshot
from envbuild.snapshot.refs import check_build_manifest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Change:
    """One subject whose fact differs between the sides (None: the side does not have it)."""

    subject: str
    before: str | None
    after: str | None
    delta_bytes: int | None = None
    item: dict[str, Any] | None = None  # e.g. kind, environment, path, distribution
    before_fields: dict[str, Any] | None = None  # e.g. status, sizes, sha256 on side a
    after_fields: dict[str, Any] | None = None


@dataclass
class Group:
    """The changes of one group; ``counts``: whether they make the sides different."""

    key: str
    title: str
    counts: bool = True
    changes: list[Change] = field(default_factory=list)


@dataclass
class DiffResult:
    """What :func:`compare` found: the changed groups, what was not compared and why, notes."""

    a: str
    b: str
    groups: list[Group]
    not_compared: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # how the sides were paired, …
    info: list[str] = field(default_factory=list)  # what differs by design, not a difference

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
            "info": self.info,
        }


def load_side(path: Path) -> tuple[Side, Snapshot | None]:
    """Read a snapshot or a build manifest and reduce it to facts (and the snapshot, if one)."""
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


def _pair_envs(a: Side, b: Side) -> list[str]:
    """Python environments are matched by the path asked for; when exactly one environment on
    each side is left unmatched (two machines, or a snapshot and a build manifest), they pair,
    and the note returned says so."""
    prefixes = ("packages ", "patches ", "files ", MODES, "overlaps ", "links ")
    only_a, only_b = unmatched_envs(a, b)
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


def unmatched_envs(a: Side, b: Side) -> tuple[set[str], set[str]]:
    """The Python environments (their paths) of ``a`` that ``b`` has not, and of ``b`` that
    ``a`` has not; exactly one on each side: :func:`compare` pairs them, naming them as ``a``."""
    a_envs = {k.removeprefix("packages ") for k in a.groups if k.startswith("packages ")}
    b_envs = {k.removeprefix("packages ") for k in b.groups if k.startswith("packages ")}
    return a_envs - b_envs, b_envs - a_envs


def compare(a: Side, b: Side) -> DiffResult:
    """The changes from side ``a`` to side ``b``, group by group in a fixed order."""
    notes = _pair_envs(a, b)
    result = DiffResult(a.label, b.label, [], notes=notes)
    envs = Group("environments", "Python environments")
    result.groups.append(envs)
    skipped: dict[str, list[str]] = {}
    for key in sorted(set(a.groups) | set(b.groups), key=group_order):
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
                elif None in (fa.detail, fb.detail) or _same_detail(fa.detail, fb.detail):
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
    same_contents(result, a, b)
    result.groups.sort(key=lambda g: group_order(g.key))
    result.not_compared = [f"{'; '.join(titles)}: {why}" for why, titles in skipped.items()]
    return result


def _same_detail(a: str | None, b: str | None) -> bool:
    """Whether two facts' details say the same; an unrecorded file's ``mode …`` by
    :func:`~.same.same_mode` (read-only is writable with the same other bits)."""
    if a is not None and b is not None and a.startswith("mode ") and b.startswith("mode "):
        return same_mode(a.removeprefix("mode "), b.removeprefix("mode "))
    return a == b


def same_contents(result: DiffResult, a: Side, b: Side) -> None:
    """Apply the identity rule of :mod:`.same` to each environment both sides have: a
    distribution with the same public version and the same files on both sides did not change
    (its package, patch and file lines go, but a file whose mode changed; a patch that makes it
    so is ``info``), and one with other files keeps its file lines and gets a package line that
    says where they differ as far as the sides tell (:func:`_where`)."""
    groups = {g.key: g for g in result.groups}
    for key, pkgs in groups.items():
        if not key.startswith("packages "):
            continue
        env = key.removeprefix("packages ")
        files = groups.get(f"files {env}", Group("", ""))
        patches = groups.get(f"patches {env}", Group("", ""))
        modes = groups.get(MODES + env)
        for name, c in contents(a.groups[key][2], b.groups[key][2]).items():
            ours = [ch for ch in files.changes if (ch.item or {}).get("distribution") == name]
            had = next((ch for ch in pkgs.changes if ch.subject == name), None)
            if not c.same and c.before == c.after and ours:
                continue  # the same version: the file lines name what differs
            pkgs.changes = [ch for ch in pkgs.changes if ch.subject != name]
            if not c.same:
                which = _where(c, ours)
                item = {"kind": "package", "environment": env, "name": name}
                line = Change(name, c.before, f"{c.after} ({which})", item=item)
                pkgs.changes.append(replace(had, after=f"{had.after} ({which})") if had else line)
                pkgs.changes.sort(key=lambda ch: ch.subject)
                continue
            for ch in ours:  # the same bytes at every path: what a line can still say is a mode
                if not counted(str((ch.item or {}).get("path"))):
                    continue  # not in the contents (a script, an installer file): compared alone
                files.changes.remove(ch)
                moved = _mode_moved(ch, env, name, a, b)
                if moved is not None and modes is not None:
                    modes.changes.append(moved)
            patched = [ch for ch in patches.changes if ch.subject == name]
            for ch in patched:
                patches.changes.remove(ch)
                result.info.append(_patch_info(name, c.before, c.after, ch, a.label, b.label))
            if had is not None and not patched:  # e.g. a RECORD rewritten to the files there
                result.info.append(
                    f"{name}: {had.before or ABSENT} → {had.after or ABSENT}, the same files"
                )
        if modes is not None:
            modes.changes.sort(key=lambda ch: ch.subject)


def _where(c: Contents, ours: list[Change]) -> str:
    """Where a distribution's files differ, as far as the sides tell: with the same RECORD on
    both, exactly the paths whose file lines differ; with other RECORDs, a path can differ
    where neither side differs from its own RECORD (the snapshot keeps a RECORD's digest, not
    its lines), so the file lines are named as such, not as the only places."""
    paths = sorted({str(ch.item["path"]) for ch in ours if ch.item})
    if c.same_record and paths:
        return f"other bytes in {', '.join(paths)}"
    if paths:
        verb = "differs" if len(paths) == 1 else "differ"
        return (
            f"other files: {', '.join(paths)} {verb} from a RECORD; the two RECORDs differ, "
            "so other paths may too"
        )
    return "other files: their RECORDs differ, and neither side names which"


def _mode_moved(ch: Change, env: str, dist: str, a: Side, b: Side) -> Change | None:
    """The mode change a file line of a distribution with the same files on both sides still
    holds, as a modes line (None: none). A file no RECORD lists records its mode as it is found
    (:class:`~envbuild.snapshot.model.pyenv.AddedFile`); one its RECORD lists has it in the
    modes table (that of the file, else its distribution's usual one)."""
    path = str((ch.item or {}).get("path"))
    statuses = {(fields or {}).get("status") for fields in (ch.before_fields, ch.after_fields)}
    if "added" not in statuses:
        return None  # listed on both sides: the modes group compares it (_mode_changes)
    ma = _mode_of(a, env, dist, path, ch.before_fields)
    mb = _mode_of(b, env, dist, path, ch.after_fields)
    if ma is None or mb is None or same_mode(ma, mb):
        return None
    return Change(
        f"{path} ({dist})",
        f"mode {ma}",
        f"mode {mb}",
        item=ch.item,
        before_fields={"status": "mode", "mode": ma},
        after_fields={"status": "mode changed", "mode": mb},
    )


def _mode_of(side: Side, env: str, dist: str, path: str, data: dict[str, Any] | None) -> str | None:
    """A file's mode on one side: as found when no RECORD lists it, else from the modes table
    (None: not known, or not there)."""
    status = (data or {}).get("status")
    if status == "added":
        mode = (data or {}).get("mode")
        return str(mode) if mode is not None else None
    if status == "missing":
        return None
    table = side.groups.get(MODES + env, ("", True, {}))[2]
    found = table.get(f"{path} ({dist})") or table.get(dist)
    return found.text if found is not None else None


def _patch_info(name: str, va: str, vb: str, ch: Change, la: str, lb: str) -> str:
    """What a patch that gives the other side's files is, as one line."""
    if ch.before is None or ch.after is None:  # patched on one side only
        (pv, pl, patches), (ov, ol) = (
            ((vb, lb, ch.after), (va, la)) if ch.before is None else ((va, la, ch.before), (vb, lb))
        )
        return (
            f"{name}: {pv} ({pl}) has the same files as {ov} ({ol}): its declared patches "
            f"{patches} make them so"
        )
    return (
        f"{name}: the same files on both sides ({va} in {la}, {vb} in {lb}); the patches "
        f"({ch.before} → {ch.after}) make them so"
    )


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


def group_order(key: str) -> tuple[int, str]:
    head = key.split(" ", 1)[0]
    return (_ORDER.index(head) if head in _ORDER else len(_ORDER), key)


def diff_files(a: Path, b: Path) -> DiffResult:
    """Compare the snapshots or build manifests at ``a`` and ``b``."""
    side_a, _ = load_side(a)
    side_b, _ = load_side(b)
    return compare(side_a, side_b)


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
        if not same_mode(usual_a[name], usual_b[name]):
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
        if not same_mode(before, after):
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
