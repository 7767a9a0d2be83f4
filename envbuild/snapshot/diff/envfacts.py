"""A Python environment of a snapshot reduced to facts: its distributions, the files that differ
from their RECORD, file modes, envbuild's patches, paths two distributions own and files that will
not load."""

from __future__ import annotations

import logging
from typing import Any

from envbuild.snapshot.diff.facts import Fact, Side
from envbuild.snapshot.model.pyenv import AddedFile, PythonEnv

log = logging.getLogger(__name__)


def env_facts(side: Side, key: str, env: PythonEnv) -> None:
    """The facts of one Python environment (``key`` names it in the group keys): its packages,
    the files that differ from their RECORD, file modes, patches, overlaps and link findings."""
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
                    "files_sha256": d.files_sha256,
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
    mode_facts(side, key, env)
    if env.patches is not None:  # None: taken by an envbuild that did not record patches
        patch_group(side, key, f"patches ({env.requested})")
        for name, rec in env.patches.items():
            put_patches(side, key, f"patches ({env.requested})", name, rec.patches)
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


def mode_facts(side: Side, key: str, env: PythonEnv) -> None:
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


def patch_group(side: Side, env_key: str, title: str) -> None:
    """The (maybe empty) group of an environment's patches."""
    side.group(f"patches {env_key}", title)


def put_patches(side: Side, env_key: str, title: str, dist: str, patches: Any) -> None:
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
