"""The link check of a generation's venv as apply runs it ([linkcheck.md](../../docs/linkcheck.md)):
preflight's ``links`` line for a generation built before, and the refusal of one just built."""

from __future__ import annotations

from typing import TYPE_CHECKING

from envbuild.apply import generations as gens
from envbuild.apply import shared
from envbuild.apply.preflight import LinkResult
from envbuild.errors import LinkFindings
from envbuild.spec.model import Spec

if TYPE_CHECKING:
    from envbuild.linkcheck.core import Report


def link_report(target: gens.Generation, spec: Spec) -> Report:
    """The link check over a generation's venv (envbuild.linkcheck.core.Report), cached per file:
    a generation checked before costs a stat per file, and a file that is still its install
    tree's inode is known by the sha256 the tree's manifest has (no file is hashed again)."""
    from envbuild.linkcheck import core as linkcheck

    digests = shared.tree_digests(target)
    return linkcheck.check_folder(
        "/", str(target.venv), accept=spec.image.link_findings, digests=digests
    )


def link_result(target: gens.Generation, spec: Spec) -> LinkResult:
    """The link check of an existing generation, for preflight's ``links`` line."""
    report = link_report(target, spec)
    return LinkResult(
        generation=target.number,
        checked=report.checked,
        findings=[(f.id, f.line()) for f in report.findings],
        accepted=len(report.accepted),
    )


def check_links(target: gens.Generation, spec: Spec) -> None:
    """Refuse to switch to a generation just built whose files will not load."""
    report = link_report(target, spec)
    if report.findings:
        raise LinkFindings(
            f"generation {target.number}",
            [f.line() for f in report.findings],
            [f.id for f in report.findings],
        )
