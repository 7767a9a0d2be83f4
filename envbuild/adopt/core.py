"""``envbuild adopt``: a hand-built environment becomes a spec, a lock and declared patches.

Input: :class:`Options` (the environment's Python, the serving unit, the index, the repository).
The stages, each in its own module:

1. the environment as the snapshot stage sees it (every file against its RECORD), the host's
   driver, GPUs and CUDA toolkits, and the unit (:mod:`envbuild.snapshot`);
2. for every distribution, what the index publishes at its version (:mod:`.index`); the wheel
   with the installed tags is fetched into the store (checked against its sha256) and its RECORD
   compared with the installed one (:mod:`.wheelrecord`): the same, it is pinned; none, or
   other files, it is a build (:mod:`.builds`, "rebuild needed");
3. every file of a pinned distribution that differs from its RECORD becomes a hunk of that
   distribution's patch, made against the published wheel's bytes (:mod:`.diffs`), and every
   text file in its folders that no RECORD lists a new file of that patch;
4. the spec (:mod:`.specfile`) with ``[host]``/``[cuda]``/``[base]`` (:mod:`.hostfacts`) and
   ``[serve]``/``[model]`` (:mod:`.serving`), validated, then locked by envbuild's own lock stage.

Output: :class:`~envbuild.adopt.report.Adopted`. Only ``specs/<name>.toml``,
``lockfiles/pylock.<name>.toml`` and ``patches/<name>/`` are written; an existing spec is kept
unless ``force``.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from packaging.utils import canonicalize_name

from envbuild.adopt import diffs, hostfacts, index, serving, specfile, wheelrecord
from envbuild.adopt.builds import Rebuild, recover
from envbuild.adopt.report import Adopted, NotAdopted, PatchWritten, Pinned
from envbuild.build.fetch import fetch_wheels
from envbuild.errors import UsageError
from envbuild.lock.wheels import WheelRef
from envbuild.snapshot import contents
from envbuild.snapshot.core import Options as SnapOptions
from envbuild.snapshot.core import take_snapshot
from envbuild.snapshot.distinfo import chosen_wheel, read_dist, wheel_tags
from envbuild.snapshot.model.core import Snapshot
from envbuild.snapshot.model.pyenv import Distribution, PythonEnv
from envbuild.snapshot.model.services import HfCacheSection
from envbuild.snapshot.nvml import Nvml
from envbuild.store.core import Store, default_store

log = logging.getLogger(__name__)

NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


@dataclass
class Options:
    python: str
    repo: Path
    name: str | None = None
    unit: str | None = None  # a systemd unit's name, or a unit file
    index_url: str = index.PYPI
    force: bool = False
    store: Store | None = None
    nvml: Nvml | None = None  # None: the real NVML
    hf_cache: str | None = None


@dataclass
class _Dist:
    model: Distribution
    site: str
    record: str | None
    wheel: Path | None = None
    pinned: Pinned | None = None
    rebuild: Rebuild | None = None
    upload: datetime | None = None


def default_name(prefix: str) -> str:
    """The environment's folder as a spec name (``/opt/glm5/.venv`` -> ``glm5``)."""
    path = Path(prefix)
    stem = path.parent.name if path.name in (".venv", "venv", "env") else path.name
    name = re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-._")
    return name or "adopted"


def _site_of(env: PythonEnv, dist: Distribution) -> str:
    for site in env.site_packages:
        if os.path.isdir(os.path.join(site, dist.dist_info)):
            return site
    return env.site_packages[0]


def _scan(opts: Options) -> Snapshot:
    return take_snapshot(
        SnapOptions(
            pythons=[opts.python], integrity="full", models=False, docker=False,
            systemd=False, links=False, nvml=opts.nvml,
        )
    )  # fmt: skip


def _candidate(d: _Dist, found: index.Published) -> WheelRef | str:
    """The published wheel with the installed tags, or why there is none."""
    name, version = d.model.name, d.model.version
    tags = wheel_tags(Path(d.site) / d.model.dist_info)
    sha = chosen_wheel([(w.filename, w.sha256 or "") for w in found.wheels], tags)
    if d.record is None:
        return "it has no RECORD, so its files cannot be compared with a published wheel"
    if not found.wheels:
        return "the index has no wheel of this version"
    if sha is None:
        return "no published wheel has the installed wheel's tags"
    wheel = next(w for w in found.wheels if w.sha256 == sha)
    d.upload = wheel.upload_time
    return WheelRef(name, version, wheel.filename, wheel.url, sha, wheel.size or 0)


def _classify(
    dists: list[_Dist], found: dict[str, index.Published], torch: str | None, store: Store
) -> None:
    """Each distribution pinned (its published wheel's RECORD is the installed one) or a build."""
    chosen = {id(d): _candidate(d, found[canonicalize_name(d.model.name)]) for d in dists}
    refs = [c for c in chosen.values() if isinstance(c, WheelRef)]
    fetched = fetch_wheels(refs, store) if refs else {}
    for d in dists:
        published = found[canonicalize_name(d.model.name)]
        got = chosen[id(d)]
        if isinstance(got, WheelRef):
            compared = wheelrecord.compare(fetched[got.sha256], d.record or "")
            if compared.same:
                d.wheel = fetched[got.sha256]
                d.pinned = Pinned(d.model.name, d.model.version, got.filename, got.sha256)
                continue
            n = len(compared.differ) + len(compared.only_wheel) + len(compared.only_installed)
            got = f"its installed files are not {got.filename}'s ({n} RECORD lines differ)"
        d.upload = published.sdist.upload_time if published.sdist else None
        d.rebuild = recover(d.model.name, d.model.version, d.site, d.record or "", torch, got)
        d.rebuild.has_sdist = published.sdist is not None


def _edits(d: _Dist, out: Adopted) -> list[diffs.Edit]:
    """The edits of a pinned distribution's files (each differing file an edit, or named)."""
    edits: list[diffs.Edit] = []
    changed = [(m.path, True) for m in d.model.modified] + [(p, False) for p in d.model.missing]
    for rel, present in sorted(changed):
        name = d.model.name
        if d.wheel is None:
            why = "its distribution is rebuilt from source (edit the source, or patch the build)"
            out.not_adopted.append(NotAdopted(name, rel, why))
            continue
        if rel.startswith("../") or os.path.isabs(rel):
            why = "installed outside site-packages (a script): patches apply inside the wheel"
            out.not_adopted.append(NotAdopted(name, rel, why))
            continue
        before = wheelrecord.member(d.wheel, rel)
        if before is None:
            out.not_adopted.append(NotAdopted(name, rel, "the published wheel has no such file"))
            continue
        after = Path(d.site, rel).read_bytes() if present else None
        if after == before:  # the RECORD was wrong as shipped; the file is the published one
            continue
        edit = diffs.Edit(rel, before, after)
        try:
            if diffs.file_diff(edit):
                edits.append(edit)
        except diffs.NotText as exc:
            out.not_adopted.append(NotAdopted(name, rel, f"not a text edit: {exc}"))
    return edits + _new_files(d)


def _new_files(d: _Dist) -> list[diffs.Edit]:
    """The files of a pinned distribution's folders that no RECORD lists, as new files of its
    patch, so that the environment built from the spec has them too (the rest stay
    ``unrecorded``: a file of no distribution, or of a rebuilt one, binary or empty bytes)."""
    if d.wheel is None:
        return []
    edits = []
    for rel in d.model.unrecorded:
        if contents.content_key(rel, d.model.dist_info) is None:
            continue  # an installer's own file, or bytecode
        if rel.split("/", 1)[0] == d.model.dist_info:
            continue  # the metadata folder is the wheel's, renamed when it is patched
        edit = diffs.Edit(rel, None, Path(d.site, rel).read_bytes())
        try:
            diffs.file_diff(edit)
        except diffs.NotText:
            continue
        edits.append(edit)
    return edits


def _header(dist: Distribution) -> str:
    """The patch's first lines (``patch`` skips text before the first ``---``)."""
    return (
        f"Hand edits of {dist.name} {dist.version}, adopted by `envbuild adopt`: the published\n"
        "wheel's files (a/) against the files found in the environment (b/), paths relative to\n"
        "site-packages (-p1).\n\n"
    )


def _cutoff(dists: list[_Dist], notes: list[str]) -> datetime:
    """uv's cutoff: one second after the newest file the lock pins, so that relocking later
    gives the same answer (no wall clock, when the index gives upload times)."""
    times = [d.upload for d in dists if d.upload is not None]
    if times and len(times) == len(dists):
        newest = max(times).astimezone(UTC).replace(microsecond=0)
        return newest + timedelta(seconds=1)
    notes.append("the index gave no upload time for some files: the cutoff is now")
    return datetime.now(UTC).replace(microsecond=0)


def _served(opts: Options, env: PythonEnv, vllm: str | None, out: Adopted) -> None:
    if not opts.unit:
        return
    from envbuild.snapshot import hfcache

    argv, environment = specfile.read_unit(opts.unit)
    python = Path(env.executable) if vllm else None
    table, source = serving.flag_table(python, vllm or "", out.notes)
    cache: HfCacheSection | None = None
    path = opts.hf_cache or serving.cache_of(argv, environment) or hfcache.default_cache()
    if os.path.isdir(path):
        cache = hfcache.read_cache(path, check_blobs=False)
    got = serving.served(argv, environment, table, source, cache, out.notes)
    out.serve, out.model, out.flags_from = got.serve, got.model, got.flags_from


def adopt(opts: Options) -> Adopted:
    """Turn the environment of ``opts.python`` into a spec, a lock and patches (see the module)."""
    snap = _scan(opts)
    env = snap.pythons[0]
    name = opts.name or default_name(env.prefix)
    if not NAME.match(name):
        raise UsageError(f"--name {name!r}: a spec name is [a-z0-9][a-z0-9._-]*")
    paths = specfile.Outputs(opts.repo, name)
    paths.check(opts.force)
    out = Adopted(name, paths.shown(paths.spec), paths.shown(paths.lock))
    if env.patches:
        for dist, rec in env.patches.items():
            out.notes.append(f"{dist} is a wheel envbuild patched ({len(rec.patches)} patches)")
    torch = env.torch_build.version if env.torch_build else None
    # the unit first: a unit that cannot be read fails before any download
    vllm = next((d.version for d in env.distributions if d.name == "vllm"), None)
    _served(opts, env, vllm, out)
    dists = []
    for model in env.distributions:
        site = _site_of(env, model)
        dists.append(_Dist(model, site, read_dist(site, model.dist_info).record))
    log.info("asking %s for %d distributions", opts.index_url, len(dists))
    found = index.published_all(opts.index_url, [(d.model.name, d.model.version) for d in dists])
    store = opts.store or default_store()
    _classify(dists, found, torch, store)
    patches: dict[str, str] = {}
    for d in dists:
        if d.pinned:
            out.pinned.append(d.pinned)
        if d.rebuild:
            out.rebuild.append(d.rebuild)
        edits = _edits(d, out)
        if edits:
            patches[d.model.name] = _header(d.model) + diffs.patch_text(edits)
            out.patches.append(
                PatchWritten(d.model.name, paths.shown(paths.patch(d.model.name)),
                             sorted(e.path for e in edits),
                             sorted(e.path for e in edits if e.before is None))
            )  # fmt: skip
    carried = {f for p in out.patches for f in p.new}
    out.unrecorded = sorted(a.path for a in env.added or [] if a.path not in carried)
    base = hostfacts.base_table(snap, out.notes)
    out.host = hostfacts.host_table(snap, out.notes)
    spec = specfile.spec_data(
        name=name,
        python=hostfacts.python_table(env, base),
        base=base,
        host=out.host,
        cuda=hostfacts.cuda_table(snap, out.notes) if out.host else None,
        pinned=[(p.name, p.version) for p in out.pinned],
        builds={r.name: r for r in out.rebuild if r.has_sdist},
        patches={dist: paths.patch_ref(dist) for dist in patches},
        serve=out.serve,
        model=out.model,
        index_url=opts.index_url,
        cutoff=_cutoff(
            [d for d in dists if d.pinned or (d.rebuild and d.rebuild.has_sdist)], out.notes
        ),
    )
    for r in out.rebuild:
        if not r.has_sdist:
            out.notes.append(
                f"{r.name} {r.version} is left out of the spec: the index has no sdist of it to "
                "rebuild from (install it by hand, or publish its source to an index)"
            )
    result = paths.write(spec, patches)
    out.lock_packages = len(result.lock.packages)
    installed = {d.model.name for d in dists}
    out.lock_added = sorted(p.name for p in result.lock.packages if p.name not in installed)
    return out


__all__ = ["Options", "adopt"]
