"""The lock's base entry, and when ``envbuild lock`` runs mmdebstrap to pin a Debian base.

A Debian base is pinned by the package set mmdebstrap installs for it: every package's name,
version, architecture and .deb sha256 (:func:`envbuild.build.base.core.resolve_debian`).
Resolving needs
mmdebstrap and the mirror, takes tens of seconds, and its answer moves whenever the mirror does.
So a relock takes the set the previous lock pinned whenever nothing it was resolved from
changed, and runs mmdebstrap only when something did:

=========== ================================================================================
mode        a Debian base's entry
=========== ================================================================================
``pin``     the previous lock's set when [base] (suite, mirror, variant, packages) and the
            cutoff (``resolution.exclude_newer``) are unchanged; otherwise resolved now
``refresh`` resolved now
``keep``    the previous lock's set when [base] is unchanged, whatever the cutoff; otherwise
            left unpinned (``packages = []``: the build resolves it). Never runs mmdebstrap.
=========== ================================================================================

``envbuild lock`` uses ``pin`` (``--refresh-base``: ``refresh``; ``--python-only``: ``keep``);
:func:`envbuild.lock.core.lock_spec` called from Python defaults to ``keep``. The other kinds of
base (image, OCI layout, rootfs tarball) are pinned by the spec itself and never resolved here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from envbuild.lock.base import debian_request, lock_base
from envbuild.lock.model import BaseLock, DebianBaseLock, Lock
from envbuild.spec.load import LoadedSpec
from envbuild.store.core import Store, default_store

log = logging.getLogger(__name__)

Source = Literal["spec", "given", "reused", "resolved", "unpinned"]

#: Resolves a Debian base's package set into the store (the build's base stage runs mmdebstrap:
#: ``envbuild.build.base.core.resolve_debian``). The lock stage sits below the build, so the caller
#: passes it in.
DebianResolver = Callable[[Store, Any], DebianBaseLock]


class BaseMode(StrEnum):
    PIN = "pin"
    REFRESH = "refresh"
    KEEP = "keep"


@dataclass(frozen=True)
class PinnedBase:
    base: BaseLock
    #: spec: not a Debian base (pinned by the spec); given: passed to lock_spec(base=...);
    #: reused: the previous lock's package set; resolved: resolved now with mmdebstrap;
    #: unpinned: a Debian base without its package set
    source: Source


@dataclass
class BasePinner:
    """Decides the base entry of each lock one ``envbuild lock`` run writes. Each distinct
    Debian request is resolved at most once per pinner (the seed specs share one base)."""

    mode: BaseMode = BaseMode.KEEP
    store: Store | None = None  # keeps the resolving run's rootfs; default: default_store()
    #: needed unless the mode is ``keep`` (which never resolves)
    resolver: DebianResolver | None = None
    _resolved: dict[tuple[str, str, str, tuple[str, ...]], DebianBaseLock] = field(
        default_factory=dict, repr=False
    )

    def __post_init__(self) -> None:
        if self.mode is not BaseMode.KEEP and self.resolver is None:
            raise ValueError(f"BasePinner(mode={self.mode.value!r}) resolves: pass resolver=")

    def pin(
        self, loaded: LoadedSpec, exclude_newer: datetime, previous: Sequence[Lock]
    ) -> PinnedBase:
        """The base entry for ``loaded``'s lock. ``previous`` are locks whose pinned set may be
        reused, best first (the lock being rewritten, then the spec's own)."""
        want = lock_base(loaded)
        if not isinstance(want, DebianBaseLock):
            return PinnedBase(want, "spec")
        request = debian_request(want)
        shown = loaded.display(loaded.path)
        if self.mode is not BaseMode.REFRESH:
            for old in previous:
                got = old.envbuild.base
                if not (isinstance(got, DebianBaseLock) and got.packages):
                    continue
                if debian_request(got) != request:
                    continue
                if self.mode is BaseMode.KEEP or old.envbuild.exclude_newer == exclude_newer:
                    log.info(
                        "%s: Debian base unchanged, keeping its %d pinned packages",
                        shown,
                        len(got.packages),
                    )
                    return PinnedBase(got, "reused")
        if self.mode is BaseMode.KEEP:
            pinned_before = any(
                isinstance(old.envbuild.base, DebianBaseLock) and old.envbuild.base.packages
                for old in previous
            )
            (log.warning if pinned_before else log.info)(
                "%s: the Debian base's package set is left unpinned%s; run `envbuild lock %s` "
                "to pin it",
                shown,
                " (the spec's [base] changed)" if pinned_before else "",
                shown,
            )
            return PinnedBase(want, "unpinned")
        if request in self._resolved:
            log.info("%s: the same Debian base as a spec locked before, pinned once", shown)
        else:
            self._resolved[request] = self._resolve(loaded, want)
        return PinnedBase(self._resolved[request], "resolved")

    def _resolve(self, loaded: LoadedSpec, want: DebianBaseLock) -> DebianBaseLock:
        assert self.resolver is not None  # __post_init__: only ``keep`` comes without one
        store = self.store if self.store is not None else default_store()
        log.info(
            "%s: resolving the Debian %s base (%s%s) with mmdebstrap against %s",
            loaded.display(loaded.path),
            want.suite,
            want.variant,
            f" + {', '.join(want.include)}" if want.include else "",
            want.mirror,
        )
        got = self.resolver(store, loaded.spec.base)
        if debian_request(got) != debian_request(want):  # pragma: no cover - a base-stage bug
            raise AssertionError(f"the resolver answered {got!r} for {want!r}")
        return got
