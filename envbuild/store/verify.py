"""``store verify``: hash every blob of a store and check every derivation record against it.

Builds trust a blob whose stat has not changed since its bytes were hashed
(:mod:`envbuild.store.stamps`); this finds what no stat shows, a damaged disk. Input: a store;
output: a :class:`VerifyResult` with one :class:`VerifyProblem` per blob or record that is wrong,
each naming what is wrong and the fix. With ``repair`` the corrupt blobs and the records that
lost an output are removed, so that the next build makes or fetches them again.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

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
    derivations: int = 0
    problems: list[VerifyProblem] = field(default_factory=list)
    repaired: bool = False

    @property
    def ok(self) -> bool:
        return not self.corrupt and not self.broken

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checked_blobs": self.checked,
            "checked_bytes": self.checked_bytes,
            "checked_derivations": self.derivations,
            "corrupt_blobs": self.corrupt,
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
        sizes = {p.name: p.lstat().st_size for p in paths}

        def check(path: Path) -> bool:
            try:
                ok = path.is_file() and store.hash_file(path) == path.name
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
        bad = set(corrupt)
        named_by: dict[str, list[str]] = {}
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
                    state = "is corrupt" if digest in bad else "is missing"
                    problems.append(
                        VerifyProblem(
                            "derivation", key, f"{drv.kind}: its output {name!r} ({digest}) "
                            f"{state}", "`--repair` removes the record; the next build makes "
                            f"the {drv.kind} again",
                        )
                    )  # fmt: skip
                    break
        for digest in corrupt:
            problems.insert(
                0,
                VerifyProblem(
                    "blob", digest, "its bytes do not hash to its name",
                    "`--repair` removes it; the next build makes or fetches it again",
                    derivations=named_by.get(digest, []),
                ),
            )  # fmt: skip
        broken = sorted(set(broken))
        if repair:
            for digest in corrupt:
                store.drop_blob(digest)
            for key in broken:
                (store.drvs / f"{key}.json").unlink(missing_ok=True)
            problems = [replace(p, repaired=True) for p in problems]
    return VerifyResult(
        checked=len(paths),
        corrupt=corrupt,
        broken=broken,
        checked_bytes=sum(sizes.values()),
        derivations=len(keys),
        problems=problems,
        repaired=repair and bool(problems),
    )
