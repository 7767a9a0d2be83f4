"""``store verify``: hash every blob of a store and check every derivation record against it.

Builds trust a blob whose stat has not changed since its bytes were hashed
(:mod:`envbuild.store.stamps`); this finds what no stat shows, a damaged disk. Input: a store;
output: a :class:`VerifyResult` with one :class:`VerifyProblem` per blob or record that is wrong,
each naming what is wrong and the fix. With ``repair`` the corrupt blobs and the records that
lost an output are removed, so that the next build makes or fetches them again.

A blob is also checked for what root never notices: its type (a folder, fifo or symlink under a
blob's name is reported, never opened, and removed by ``repair``) and its mode (0444: output
folders hard-link blobs, and a blob of mode 0000 that root reads well is unreadable to other
users there; ``repair`` restores the mode). A removed blob is restored from an output folder
that still holds a copy with the right bytes; otherwise the problem says the next build makes
or fetches it again.
"""

from __future__ import annotations

import logging
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from envbuild.errors import EnvbuildError
from envbuild.store.blobs import BLOB_MODE
from envbuild.store.core import Derivation, Store, derivation_key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VerifyProblem:
    """One thing ``store verify`` found wrong: a blob (and the derivations that name it) or a
    derivation record; what is wrong; what fixes it; and whether ``--repair`` did."""

    what: str  # "blob" or "derivation"
    name: str  # the digest or the key
    reason: str
    fix: str
    derivations: list[str] = field(default_factory=list)  # "kind key" naming a blob
    repaired: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "name": self.name,
            "reason": self.reason,
            "fix": self.fix,
            "derivations": self.derivations,
            "repaired": self.repaired,
        }

    def render(self) -> str:
        by = f" (output of {', '.join(self.derivations)})" if self.derivations else ""
        done = "; repaired" if self.repaired else ""
        return f"{self.what} {self.name}{by}: {self.reason} (fix: {self.fix}){done}"


@dataclass(frozen=True)
class VerifyResult:
    """What ``store verify`` checked and found."""

    checked: int
    corrupt: list[str]  # blob digests whose content does not hash to their name
    broken: list[str]  # derivation keys whose outputs are missing or corrupt
    checked_bytes: int = 0
    bad_modes: list[str] = field(default_factory=list)  # right bytes, mode not 0444
    derivations: int = 0
    problems: list[VerifyProblem] = field(default_factory=list)
    repaired: bool = False

    @property
    def ok(self) -> bool:
        return not self.corrupt and not self.broken and not self.bad_modes

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checked_blobs": self.checked,
            "checked_bytes": self.checked_bytes,
            "checked_derivations": self.derivations,
            "corrupt_blobs": self.corrupt,
            "bad_modes": self.bad_modes,
            "broken_derivations": self.broken,
            "problems": [p.as_dict() for p in self.problems],
            "repaired": self.repaired,
        }


def verify(store: Store, *, repair: bool = False, workers: int | None = None) -> VerifyResult:
    """Hash every blob (``workers`` threads at once: hashlib lets go of the GIL) and check
    every derivation record and its outputs. With ``repair`` corrupt blobs are removed (a
    wheel is fetched again, an image's config or manifest written again by the next build)
    and so are the records that lost an output (the next build makes them again)."""
    store._ensure()
    with store.session():
        paths = sorted(p for p in store.blobs.iterdir() if not p.name.startswith("."))
        modes = {p.name: p.lstat().st_mode for p in paths}
        sizes = {p.name: p.lstat().st_size if stat.S_ISREG(modes[p.name]) else 0 for p in paths}

        def check(path: Path) -> bool:
            if not stat.S_ISREG(modes[path.name]):
                return False  # never opened: a fifo would block
            try:
                ok = store.hash_file(path) == path.name
            except OSError:
                ok = False
            if ok:
                store.stamp(path)
            return ok

        n = workers or min(8, os.cpu_count() or 1)
        # biggest first, so that one big layer does not finish alone at the end
        order = sorted(paths, key=lambda p: -sizes[p.name])
        with ThreadPoolExecutor(max_workers=max(1, n), thread_name_prefix="verify") as pool:
            good = dict(zip(order, pool.map(check, order), strict=True))
        corrupt = sorted(f"sha256:{p.name}" for p, ok in good.items() if not ok)
        bad_modes = sorted(
            f"sha256:{p.name}"
            for p, ok in good.items()
            if ok and stat.S_IMODE(modes[p.name]) != BLOB_MODE
        )
        bad = set(corrupt)
        named_by: dict[str, list[str]] = {}
        lost: dict[str, str] = {}  # derivation key: the output blob it lost
        broken: list[str] = []
        problems: list[VerifyProblem] = []
        keys = store.derivations()
        for key in keys:
            try:
                drv = Derivation.model_validate_json((store.drvs / f"{key}.json").read_bytes())
            except (ValidationError, ValueError, OSError):
                broken.append(key)
                problems.append(
                    VerifyProblem(
                        "derivation", key, "its record is unreadable",
                        "`--repair` removes it; the next build makes it again",
                    )
                )  # fmt: skip
                continue
            if drv.key != key or derivation_key(drv.kind, drv.inputs) != key:
                broken.append(key)
                problems.append(
                    VerifyProblem(
                        "derivation", key, f"its record ({drv.kind}) is not the one its "
                        "name promises (its inputs hash to another key)",
                        "`--repair` removes it; the next build makes it again",
                    )
                )  # fmt: skip
                continue
            for name, digest in sorted(drv.outputs.items()):
                named_by.setdefault(digest, []).append(f"{drv.kind} {key[:12]}")
                if digest in bad or not store.has_blob(digest):
                    broken.append(key)
                    lost[key] = digest
                    state = "is corrupt" if digest in bad else "is missing"
                    problems.append(
                        VerifyProblem(
                            "derivation", key, f"{drv.kind}: its output {name!r} ({digest}) "
                            f"{state}", "`--repair` removes the record; the next build makes "
                            f"the {drv.kind} again",
                        )
                    )  # fmt: skip
                    break
        blob_problems = [
            VerifyProblem(
                "blob", digest, _what_is_wrong(modes[digest[7:]]),
                "`--repair` removes it (and restores it from an output folder that holds it); "
                "else the next build makes or fetches it again",
                derivations=named_by.get(digest, []),
            )
            for digest in corrupt
        ]  # fmt: skip
        blob_problems += [
            VerifyProblem(
                "blob", digest, f"its mode is {stat.S_IMODE(modes[digest[7:]]):04o}, not "
                f"{BLOB_MODE:04o}: other users cannot read the output folders that link it",
                "`--repair` restores its mode", derivations=named_by.get(digest, []),
            )
            for digest in bad_modes
        ]  # fmt: skip
        problems = blob_problems + problems
        broken = sorted(set(broken))
        if repair:
            restored = {}
            for digest in corrupt:
                store.drop_blob(digest)
                restored[digest] = _restore(store, digest)
            for digest in bad_modes:
                store.restore_mode(store.blob_path(digest))
            for key in broken:
                if restored.get(lost.get(key, "")) is None:  # else its output is back
                    (store.drvs / f"{key}.json").unlink(missing_ok=True)
            problems = [
                replace(p, repaired=True, fix=_fixed(p, restored.get(p.name))) for p in problems
            ]
    return VerifyResult(
        checked=len(paths),
        corrupt=corrupt,
        broken=broken,
        checked_bytes=sum(sizes.values()),
        bad_modes=bad_modes,
        derivations=len(keys),
        problems=problems,
        repaired=repair and bool(problems),
    )


def _what_is_wrong(mode: int) -> str:
    """Why a blob failed its check: what takes its name, or its bytes."""
    if stat.S_ISREG(mode):
        return "its bytes do not hash to its name"
    kind = _KINDS.get(stat.S_IFMT(mode), "not a file")
    return f"it is {kind}, not a file"


_KINDS = {
    stat.S_IFDIR: "a folder",
    stat.S_IFIFO: "a fifo",
    stat.S_IFLNK: "a symlink",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
}


def _restore(store: Store, digest: str) -> str | None:
    """Put blob ``digest`` back from an output folder that holds a file of it with the right
    bytes (a folder's blobs are hard links or copies of the store's); the folder's path, or
    None when none does."""
    try:
        roots = store.roots()
    except EnvbuildError:
        return None
    for root in sorted(roots.values(), key=lambda r: r.name):
        if root.output is None:
            continue
        copy = Path(root.output) / "oci" / "blobs" / "sha256" / digest[7:]
        try:
            if store.hash_file(copy) != digest[7:]:
                continue
            store.add_file(copy, expected=digest)
        except (OSError, EnvbuildError):
            continue
        return root.output
    return None


def _fixed(problem: VerifyProblem, restored_from: str | None) -> str:
    if problem.what != "blob" or problem.fix.startswith("`--repair` restores its mode"):
        return problem.fix
    if restored_from is not None:
        return f"removed; restored from the output folder {restored_from}"
    return "removed; no output folder holds it: the next build makes or fetches it again"
