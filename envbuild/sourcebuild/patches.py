"""Patches to a distribution, applied to its wheel as a derivation.

A spec may name patches for a distribution (``[patches] vllm = ["patches/x.patch"]``). The patched
result is a new wheel: the original unpacked, each patch applied in order with GNU ``patch``
(``--dry-run`` first, strip level 1, no fuzz: a patch applies exactly or not at all), the version
given a local segment ``+envbuild.<hash>`` (``.dist-info`` renamed, ``METADATA`` updated, the file
name changed), ``RECORD`` rewritten so every file verifies, and the wheel repacked
deterministically (sorted entries, fixed timestamps, fixed modes). The patches applied are listed
in ``<name>-<version>.dist-info/envbuild-patches.json`` so an installed environment shows them.

The derivation's inputs are the wheel's sha256 and the patches' sha256s, in order.
"""

from __future__ import annotations

import csv
import hashlib
import io
import logging
import os
import re
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version
from pydantic import BaseModel, ConfigDict, Field

from envbuild import scratch
from envbuild.errors import InputFileError, PatchFailed, UserError
from envbuild.fsio import atomic_writer, canonical_json, record_digest, sha256_file
from envbuild.proc import core as proc
from envbuild.store.core import Output, Store, derivation_key

log = logging.getLogger(__name__)

#: Fixed time of every repacked entry (the earliest a zip can hold): no wall clock in outputs.
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
PATCHES_FILE = "envbuild-patches.json"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PatchRef(_Model):
    """A patch as a derivation input: where the spec names it and what its bytes are."""

    path: str = Field(description="relative to the repository root")
    sha256: str


class PatchedWheel(_Model):
    """A patched wheel: the original's version, the new one and file name, what was applied."""

    dist: str
    version: str = Field(description="the original version")
    patched_version: str
    wheel: str = Field(description="the patched wheel's file name")
    sha256: str
    patches: list[PatchRef]
    files: list[str] = Field(description="files the patches touched, relative to site-packages")


def local_version(version: str, short: str) -> str:
    """``1.2.3`` → ``1.2.3+envbuild.<short>``; a local part stays (``+cu130.envbuild.<short>``)."""
    parsed = Version(version)
    return f"{version}.envbuild.{short}" if parsed.local else f"{version}+envbuild.{short}"


_MARKER = re.compile(r"[+.]envbuild\.[0-9a-z]+$")


def unpatched_version(version: str) -> str:
    """The version :func:`local_version` was given: ``1.2.3+envbuild.<short>`` → ``1.2.3``,
    ``1.2.3+cu130.envbuild.<short>`` → ``1.2.3+cu130``; any other version as it is."""
    return _MARKER.sub("", version)


# --- applying ---------------------------------------------------------------------------------

_CHECKING = re.compile(r"^(?:checking|patching) file (.+?)\s*$")
_HUNK_FAILED = re.compile(r"^Hunk #(\d+) FAILED at (\d+)")
_NO_FILE = re.compile(r"can't find file to patch at input line (\d+)")
_MALFORMED = re.compile(r"malformed patch at line (\d+)(?::\s*(.*))?")


def _explain(output: str) -> tuple[str, list[str]]:
    """What GNU patch's output says went wrong: a summary and one line per failed hunk."""
    current = "?"
    hunks: list[str] = []
    summary = "does not apply"
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if m := _CHECKING.match(line):
            current = m.group(1).strip("'\"")
        elif m := _HUNK_FAILED.match(line):
            hunks.append(f"hunk #{m.group(1)} of {current} FAILED at line {m.group(2)}")
        elif "Reversed (or previously applied) patch detected" in line:
            hunks.append(f"{current}: already applied (or reversed)")
        elif m := _NO_FILE.search(line):
            target = next(
                (ln.split()[1] for ln in lines[i : i + 12] if ln.startswith(("|+++ ", "+++ "))),
                "?",
            )
            hunks.append(
                f"the file it patches does not exist: {target} (patch line {m.group(1)}; "
                "paths must be relative to site-packages with one leading a/ or b/)"
            )
        elif m := _MALFORMED.search(line):
            summary = f"is not a valid patch (malformed at line {m.group(1)})"
    if hunks and not summary.startswith("is not"):
        summary = f"does not apply ({len(hunks)} problem(s))"
    return summary, hunks


def apply_patch(tree: Path, patch: Path, shown: str) -> list[str]:
    """Apply one patch to ``tree`` (dry run first). Returns the files it touched."""
    tool = proc.which("patch", hint="install GNU patch (Debian: apt-get install patch)")
    argv = [tool, "-p1", "--batch", "--forward", "--fuzz=0", "--no-backup-if-mismatch"]
    argv += ["--reject-file=-", f"--directory={tree}", f"--input={patch}"]
    env = proc.child_env()
    dry = proc.run([*argv, "--dry-run"], tool="patch", env=env, check=False)
    output = dry.stdout + dry.stderr
    if dry.returncode != 0:
        summary, hunks = _explain(output)
        raise PatchFailed(shown, summary, hunks=hunks, output=output)
    done = proc.run(argv, tool="patch", env=env, check=False)
    if done.returncode != 0:  # pragma: no cover - the dry run said it would apply
        summary, hunks = _explain(done.stdout + done.stderr)
        raise PatchFailed(shown, summary, hunks=hunks, output=done.stdout + done.stderr)
    return sorted(
        {m.group(1).strip("'\"") for ln in done.stdout.splitlines() if (m := _CHECKING.match(ln))}
    )


# --- the wheel --------------------------------------------------------------------------------


@dataclass
class _Unpacked:
    root: Path
    dist_info: str  # name-version.dist-info
    modes: dict[str, int]


def _unpack(wheel: Path, into: Path) -> _Unpacked:
    modes: dict[str, int] = {}
    try:
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                target = (into / info.filename).resolve()
                if not target.is_relative_to(into.resolve()):
                    raise InputFileError(wheel, f"member {info.filename!r} escapes the wheel")
                if info.is_dir():
                    continue
                zf.extract(info, into)
                modes[info.filename] = 0o755 if (info.external_attr >> 16) & 0o111 else 0o644
    except zipfile.BadZipFile as exc:
        raise InputFileError(wheel, f"is not a wheel (zip): {exc}") from None
    infos = [p.name for p in into.iterdir() if p.is_dir() and p.name.endswith(".dist-info")]
    if len(infos) != 1:
        raise InputFileError(wheel, f"has {len(infos)} .dist-info folders, expected one")
    return _Unpacked(into, infos[0], modes)


def _record_line(rel: str, data: bytes) -> str:
    return f"{_csv(rel)},sha256={record_digest(hashlib.sha256(data).digest())},{len(data)}"


def _csv(value: str) -> str:
    return f'"{value}"' if any(c in value for c in ',"\n') else value


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def repack(unpacked: _Unpacked, dist_info: str, out: Path) -> None:
    """Write RECORD for every file under ``unpacked.root`` and zip it deterministically."""
    root = unpacked.root
    record_rel = f"{dist_info}/RECORD"
    names = [n for n in _files(root) if n != record_rel]
    body = [n for n in names if not n.startswith(f"{dist_info}/")]
    meta = [n for n in names if n.startswith(f"{dist_info}/")]
    ordered = [*body, *meta]
    lines = [_record_line(n, (root / n).read_bytes()) for n in ordered]
    lines.append(f"{_csv(record_rel)},,")
    (root / record_rel).write_text("\n".join(lines) + "\n", encoding="utf-8")
    with atomic_writer(out) as raw, zipfile.ZipFile(raw, "w") as zf:
        for name in [*ordered, record_rel]:
            info = zipfile.ZipInfo(name, date_time=ZIP_EPOCH)
            info.create_system = 3
            mode = unpacked.modes.get(_old_name(name, unpacked.dist_info, dist_info), 0o644)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, (root / name).read_bytes(), compresslevel=6)


def _old_name(name: str, old_info: str, new_info: str) -> str:
    old_data, new_data = (
        old_info.replace(".dist-info", ".data"),
        new_info.replace(".dist-info", ".data"),
    )
    for new, old in ((new_info, old_info), (new_data, old_data)):
        if name.startswith(new + "/"):
            return old + name[len(new) :]
    return name


def _set_version(metadata: Path, version: str) -> None:
    text = metadata.read_text(encoding="utf-8")
    head, sep, rest = text.partition("\n\n")
    new_head, n = re.subn(r"(?m)^Version:.*$", f"Version: {version}", head, count=1)
    if n != 1:
        raise InputFileError(metadata.name, "METADATA has no Version field")
    metadata.write_text(new_head + sep + rest, encoding="utf-8")


def patch_wheel(
    wheel: Path,
    patches: Sequence[tuple[Path, PatchRef]],
    short: str,
    out_dir: Path,
    *,
    filename: str | None = None,
) -> PatchedWheel:
    """Apply ``patches`` to ``wheel``; write the patched wheel into ``out_dir``.

    ``short`` is the local-version hash (from the derivation key). Raises :class:`PatchFailed`.
    """
    filename = filename or wheel.name
    name, version, _build, tags = parse_wheel_filename(filename)
    tag = filename[:-4].split("-", 2)[2]  # python-abi-platform (and a build tag) as written
    del tags
    with scratch.temp_dir("patch-") as tmp:
        unpacked = _unpack(wheel, Path(tmp) / "w")
        touched: set[str] = set()
        for path, ref in patches:
            touched.update(apply_patch(unpacked.root, path, ref.path))
            log.info("applied %s to %s %s", ref.path, name, version)
        new_version = local_version(str(version), short)
        stem = unpacked.dist_info.removesuffix(".dist-info").rsplit("-", 1)[0]
        new_info = f"{stem}-{new_version}.dist-info"
        root = unpacked.root
        os.rename(root / unpacked.dist_info, root / new_info)
        old_data = root / unpacked.dist_info.replace(".dist-info", ".data")
        if old_data.is_dir():
            os.rename(old_data, root / new_info.replace(".dist-info", ".data"))
        _set_version(root / new_info / "METADATA", new_version)
        listing = {
            "dist": str(name),
            "version": str(version),
            "patches": [p.model_dump() for _, p in patches],
        }
        (root / new_info / PATCHES_FILE).write_text(canonical_json(listing), encoding="utf-8")
        filename = f"{stem}-{new_version}-{tag}.whl"
        target = out_dir / filename
        repack(unpacked, new_info, target)
    return PatchedWheel(
        dist=str(name),
        version=str(version),
        patched_version=new_version,
        wheel=filename,
        sha256=sha256_file(target),
        patches=[p for _, p in patches],
        files=sorted(touched),
    )


def verify_record(wheel: Path, record: str | None = None) -> list[str]:
    """Problems with a wheel's RECORD (``record``, default the first ``.dist-info/RECORD``):
    files whose hash or size differ, files it does not list, files it lists that are not in
    the wheel."""
    problems: list[str] = []
    with zipfile.ZipFile(wheel) as zf:
        names = [i.filename for i in zf.infolist() if not i.is_dir()]
        if record is None:
            record = next((n for n in names if n.endswith(".dist-info/RECORD")), None)
        if record is None or record not in names:
            return ["no RECORD"]
        listed: dict[str, tuple[str, str]] = {}
        for row in csv.reader(io.StringIO(zf.read(record).decode())):
            if row:
                listed[row[0]] = (row[1], row[2])
        for n in names:
            if n == record:
                continue
            if n not in listed:
                problems.append(f"{n}: not in RECORD")
                continue
            data = zf.read(n)
            want_hash, want_size = listed[n]
            got = _record_line(n, data).rsplit(",", 2)
            if got[1] != want_hash or str(len(data)) != want_size:
                problems.append(
                    f"{n}: RECORD says {want_hash},{want_size}; file is {got[1]},{len(data)}"
                )
        gone = sorted(set(listed) - set(names))
        problems += [f"{n}: in RECORD but not in the wheel" for n in gone]
    return problems


# --- the derivation ---------------------------------------------------------------------------

KIND = "patch"
SHORT = 10


class PatchResult(_Model):
    """A realized patch derivation: its key, whether it was reused, the stored wheel."""

    key: str
    reused: bool
    wheel_digest: str
    patched: PatchedWheel


def patch_inputs(
    dist: str, wheel_name: str, wheel_sha256: str, patches: Sequence[PatchRef]
) -> dict[str, object]:
    """The derivation inputs: the wheel's sha256 and each patch's path and sha256, in order."""
    return {
        "dist": canonicalize_name(dist),
        "wheel": {"name": wheel_name, "sha256": wheel_sha256},
        "patches": [p.model_dump() for p in patches],
    }


def patched_version(version: str, key: str) -> str:
    """The version a patch derivation ``key`` gives a wheel of ``version``."""
    return local_version(version, key[:SHORT])


def realize_patch(
    store: Store,
    dist: str,
    wheel: Path | Callable[[], Path],
    patches: Sequence[tuple[Path, PatchRef]],
    *,
    filename: str | None = None,
    wheel_sha256: str | None = None,
) -> PatchResult:
    """The patched wheel of ``dist``: from the store when these inputs were patched before (or
    from the remote cache in front of it), else made.

    ``wheel_sha256``: the wheel's sha256 when already known (a store blob is named by it), so a
    patch found in the store neither reads nor hashes the wheel (``wheel`` need not exist then).
    ``wheel`` may be a function that gives the wheel's path (fetching it): it is called only when
    the patch is really made, and needs ``filename`` and ``wheel_sha256``.
    """
    for path, ref in patches:
        if not path.is_file():
            raise InputFileError(ref.path, "no such patch file")
        got = sha256_file(path)
        if got != ref.sha256:
            raise UserError(
                f"{ref.path}: sha256 {got}, the lock says {ref.sha256}",
                hint="the patch changed since the lock was made; run `envbuild lock`",
            )
    if callable(wheel):
        if filename is None or wheel_sha256 is None:
            raise TypeError("a wheel given by a function needs its filename and wheel_sha256")
        wheel_sha, name = wheel_sha256, filename
    else:
        wheel_sha = wheel_sha256 or sha256_file(wheel)
        name = filename or wheel.name  # a store blob is named by its digest: pass the file name
    inputs = patch_inputs(dist, name, wheel_sha, [r for _, r in patches])
    key = derivation_key(KIND, inputs)

    def build() -> Output:
        source = wheel() if callable(wheel) else wheel
        with store.temp_dir(prefix="patch-") as tmp:
            patched = patch_wheel(source, patches, key[:SHORT], tmp, filename=name)
            digest = store.add_file(tmp / patched.wheel)
        return Output(outputs={"wheel": digest}, meta={"patched": patched.model_dump()})

    realized = store.realize(KIND, inputs, build)
    drv = realized.drv
    return PatchResult(
        key=drv.key,
        reused=realized.reused,
        wheel_digest=drv.outputs["wheel"],
        patched=PatchedWheel.model_validate(drv.meta["patched"]),
    )
