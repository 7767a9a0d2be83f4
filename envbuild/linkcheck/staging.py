"""The ELF facts of a layer's wheels, read from its staging tree into the link-check cache.

A cold build installs every wheel uncompressed into a layer's staging root
(:mod:`envbuild.build.layerbuild`) before the links stage would inflate the same members from
the wheels again (:mod:`envbuild.linkcheck.wheels`). :func:`record_staged` takes, for each of
the layer's wheels whose sha256 is known, the members that stage reads — the same member list
(:func:`~envbuild.linkcheck.wheels.wheel_members`: the member→path rule, the paths the layer
leaves out) — reads each one's facts from its file in the staging root and puts them in the
cache under the key that stage asks for (:func:`~envbuild.linkcheck.wheels.member_key`), with
the wheel's member map (:func:`~envbuild.linkcheck.wheels.map_key`). The links stage then
finds them and opens no member.

Only a file whose bytes are the member's is recorded: a regular file of the member's size and
CRC-32 (a file the layer rewrote, or another wheel's at the same path, is left to the links
stage, which reads the wheel); so is a file that is not a readable ELF file (the links stage
writes such a member out to name it in its report). pyelftools seeks only the headers and the
dynamic tables; the CRC reads the whole file once, from the page cache the install just filled.
Nothing here fails a build: a wheel or file it cannot read is left to the links stage.
"""

from __future__ import annotations

import logging
import mmap
import os
import stat
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from isal import isal_zlib

from envbuild.installed.venv import VenvTarget
from envbuild.linkcheck.facts import ElfInfo
from envbuild.linkcheck.reader import Cache
from envbuild.linkcheck.wheels import Wheel, map_key, member_key, wheel_members

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Staged:
    """What :func:`record_staged` did: members put in the cache, members found there already,
    and members left to the links stage (not the member's bytes on disk, or not readable)."""

    recorded: int = 0
    known: int = 0
    left: int = 0


def record_staged(
    root: Path,
    wheels: Iterable[Wheel],
    target: VenvTarget,
    cache: Cache,
    leaves: Mapping[str, frozenset[str]] | None = None,
) -> Staged:
    """Put the facts of the ELF members of ``wheels`` (installed for ``target`` into the
    staging root ``root``, less the paths ``leaves`` names per distribution) in ``cache``,
    read from their files under ``root``. A wheel without a sha256 is skipped."""
    recorded = known = left = 0
    for wheel in wheels:
        if not wheel.sha256:
            continue
        leave = (leaves or {}).get(wheel.dist, frozenset())
        try:
            with zipfile.ZipFile(wheel.path) as zf:
                members = wheel_members(zf, target, leave, records=False)
                infos = {m: zf.getinfo(m) for _, m, _, elf in members if elf}
        except (OSError, zipfile.BadZipFile, KeyError) as exc:
            log.debug("staged link facts: %s not read: %s", wheel.path.name, exc)
            continue
        key = map_key(wheel.sha256, target, leave)
        if cache.get_doc("wheels", key) is None:
            cache.put_doc("wheels", key, [list(m) for m in members])
        for env, member, _, elf in members:
            if not elf:
                continue
            digest = member_key(wheel.sha256, member)
            if cache.get(digest)[0]:
                known += 1
                continue
            info = infos[member]
            facts = staged_facts(root / env.lstrip("/"), info.file_size, info.CRC)
            if facts is None:
                left += 1
                continue
            cache.put(digest, facts[0])
            recorded += 1
    log.debug("staged link facts: %d recorded, %d known, %d left", recorded, known, left)
    return Staged(recorded, known, left)


def staged_facts(path: Path, size: int, crc: int) -> tuple[ElfInfo | None] | None:
    """(the ELF facts, None for a file that is not a host ELF object) of the file at ``path``
    when it is a regular file of ``size`` bytes and CRC-32 ``crc``, else None (also when it is
    not a readable ELF file: the links stage reports it)."""
    from envbuild.linkcheck.elf import BadElf, read_elf

    try:
        with open(path, "rb", opener=_nofollow) as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size != size:
                return None
            if size:
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
                    same = isal_zlib.crc32(view) & 0xFFFFFFFF == crc
            else:
                same = crc == 0
            if not same:
                return None
            return (read_elf(f),)
    except (OSError, ValueError, BadElf):
        return None


def _nofollow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW)
