"""Installing locked wheels into a staging tree laid out as the image's venv.

A *source* (a locked wheel: name, version, url, sha256, size) is fetched once into the store and
installed with uv into a *destination* (a staging directory that stands for the image's root; the
venv sits at ``target.venv`` inside it). The build host's Python is only uv's helper: nothing is
installed into it, and nothing of it (its path, the staging path, a user name, a time) stays in
the tree. Each call installs one layer's distributions into a fresh staging root, so a
distribution at one version always gives the same files.

After uv: its lock file and cache note go, console-script shebangs name the image's venv
interpreter (``/opt/venv/bin/python``) with their RECORD lines rehashed, ``lib/pythonX.Y`` is
named after the image's Python, and modes are normalized (umask must not leak into a layer).
"""

from __future__ import annotations

import csv
import hashlib
import io
import logging
import os
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from packaging.utils import canonicalize_name

from envbuild import scratch
from envbuild.errors import IntegrityError, ToolFailed
from envbuild.fsio import record_digest
from envbuild.installed.venv import VenvTarget
from envbuild.lock.wheels import WheelRef
from envbuild.proc import core as proc

log = logging.getLogger(__name__)

#: Bumped whenever the installed tree for the same inputs would change.
INSTALL_FORMAT = 1
#: Bumped whenever the venv layer (pyvenv.cfg, bin/python*) would change: 2 dropped the
#: ``command = … -m venv`` line of pyvenv.cfg, which claimed a tool that never ran.
VENV_FORMAT = 2


# --- installing -------------------------------------------------------------------------------


@dataclass
class Installed:
    """What one install call put into a staging root."""

    root: Path
    dists: list[str] = field(default_factory=list)
    files: int = 0
    bytes: int = 0


def install(
    wheels: Sequence[tuple[WheelRef, Path]],
    target: VenvTarget,
    root: Path,
    *,
    remove: Mapping[str, Collection[str]] | None = None,
    uv: str | None = None,
    cache: Path | None = None,
) -> Installed:
    """Install ``wheels`` (each with the path of its verified file) into ``root`` + venv.

    ``root`` must be empty or absent: one call makes one layer's tree. ``remove`` names, per
    distribution, venv-relative paths to leave out (the losing side of a resolved overlap).
    ``cache`` is uv's cache directory (unzipped wheels, copied from, never linked); without it
    uv unzips into a throwaway cache. The installed bytes are the same either way.
    """
    root.mkdir(parents=True, exist_ok=True)
    if any(root.iterdir()):
        raise ValueError(f"staging root {root} is not empty")
    prefix = root / target.rel
    if not wheels:
        return Installed(root)
    with scratch.temp_dir("wheels-") as tmp:  # locked: what a killed run left, the next removes
        # each wheel is offered at a path that names its sha256 and stays the same from one
        # build to the next, so uv's cache (keyed by the path) finds what it unzipped before
        stable = cache.parent / "uv-wheels" if cache is not None else Path(tmp)
        find_links: list[proc.Arg] = []
        lines = []
        for wheel, path in sorted(wheels):
            link = stable / wheel.sha256 / wheel.filename
            _symlink(link, path.resolve())
            find_links += ["--find-links", link.parent]
            lines.append(f"{wheel.canonical}=={wheel.version} --hash=sha256:{wheel.sha256}")
        req = Path(tmp) / "requirements.txt"
        req.write_text("\n".join(lines) + "\n")
        argv: list[proc.Arg] = [
            uv or proc.find_uv(),
            "pip",
            "install",
            "--no-config",
            "--no-deps",
            "--require-hashes",
            "--no-index",
            *find_links,
            "--link-mode=copy",
            *(["--cache-dir", cache] if cache is not None else ["--no-cache"]),
            "--python",
            sys.executable,
            f"--python-version={target.python_version}",
            "--prefix",
            prefix,
            "-r",
            req,
        ]
        if (platform := target.uv_platform()) is not None:
            argv[argv.index("--prefix") : argv.index("--prefix")] = [
                f"--python-platform={platform}"
            ]
        env = proc.uv_env()  # the lock decides: no UV_* of the caller's
        try:
            proc.run(
                argv, tool="uv", env=env, on_failure="the lock may not fit the image's platform"
            )
        except ToolFailed:
            _check_wheels(wheels)  # a wheel that is not what the lock says: that is the cause
            raise
    return _finish(root, target, sorted(canonicalize_name(w.name) for w, _ in wheels), remove)


def _check_wheels(wheels: Sequence[tuple[WheelRef, Path]]) -> None:
    """After uv failed: raise :class:`IntegrityError` for the first wheel file whose bytes are
    not the ones the lock names (uv then reports a hash mismatch or a bad zip CRC, which is no
    matter of the platform)."""
    for wheel, path in sorted(wheels):
        h = hashlib.sha256()
        try:
            with path.open("rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
        except OSError:
            continue
        if h.hexdigest() != wheel.sha256:
            raise IntegrityError(
                f"{path} ({wheel.filename}) no longer matches the lock's sha256 {wheel.sha256}: "
                "the store's copy was changed or damaged",
                hint="run `envbuild store verify --repair` (the next build fetches it again), "
                "then build again",
            )


def _symlink(link: Path, target: Path) -> None:
    """``link`` -> ``target``, made atomically (two builds may offer the same wheel at once)."""
    if link.is_symlink() and os.readlink(link) == str(target):
        return
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.{os.getpid()}.{id(link)}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, link)


def _finish(
    root: Path,
    target: VenvTarget,
    dists: list[str],
    remove: Mapping[str, Collection[str]] | None,
) -> Installed:
    prefix = root / target.rel
    (prefix / ".lock").unlink(missing_ok=True)
    _name_lib_dir(prefix, target)
    site = prefix / target.site_packages
    changed: set[Path] = set()
    gone: set[Path] = set()
    for dist_info in sorted(site.glob("*.dist-info")):
        note = dist_info / "uv_cache.json"
        if note.exists():
            note.unlink()
            gone.add(note)
    changed |= _fix_shebangs(prefix / "bin", target)
    for dist, paths in sorted((remove or {}).items()):
        for rel in sorted(paths):
            victim = prefix / rel
            if victim.is_file() or victim.is_symlink():
                victim.unlink()
                gone.add(victim)
                log.debug("left out %s of %s (overlap resolved by the spec)", rel, dist)
    _rewrite_records(site, changed, gone)
    _prune_empty(prefix, keep={prefix, prefix / "lib", site.parent, site, prefix / "bin"})
    files, size = normalize_modes(root)
    return Installed(root, dists, files, size)


def _name_lib_dir(prefix: Path, target: VenvTarget) -> None:
    """uv lays out ``lib/pythonX.Y`` for its helper interpreter; name it for the image's."""
    want = prefix / "lib" / f"python{target.python_version}"
    if want.exists():
        return
    found = sorted((prefix / "lib").glob("python*"))
    if len(found) == 1:
        found[0].rename(want)


def _fix_shebangs(bin_dir: Path, target: VenvTarget) -> set[Path]:
    """Point scripts uv wrote for its helper interpreter at the image's venv interpreter."""
    changed: set[Path] = set()
    if not bin_dir.is_dir():
        return changed
    helper = sys.executable.encode()
    new = f"#!{target.python}\n".encode()
    for script in sorted(bin_dir.iterdir()):
        if not script.is_file() or script.is_symlink():
            continue
        data = script.read_bytes()
        fixed = _rewrite_shebang(data, helper, new)
        if fixed is not None:
            script.write_bytes(fixed)
            changed.add(script)
    return changed


def _rewrite_shebang(data: bytes, helper: bytes, new: bytes) -> bytes | None:
    first, _, rest = data.partition(b"\n")
    if first.startswith(b"#!") and first[2:].strip().split(b" ")[0] == helper:
        return new + rest
    # uv's form for interpreter paths too long (or with spaces) for a shebang line
    if first == b"#!/bin/sh":
        second, _, tail = rest.partition(b"\n")
        third, _, body = tail.partition(b"\n")
        if second.startswith(b"'''exec' ") and helper in second and third == b"' '''":
            return new + body
    return None


def _rewrite_records(site: Path, changed: set[Path], gone: set[Path]) -> None:
    if not changed and not gone:
        return
    for record in sorted(site.glob("*.dist-info/RECORD")):
        rows = _read_csv(record.read_text())
        out: list[list[str]] = []
        dirty = False
        for row in rows:
            if not row:
                continue
            path = Path(os.path.normpath(site / row[0]))
            if path in gone:
                dirty = True
                continue
            if path in changed:
                data = path.read_bytes()
                digest = record_digest(hashlib.sha256(data).digest())
                row = [row[0], f"sha256={digest}", str(len(data))]
                dirty = True
            out.append(row)
        if dirty:
            buf = io.StringIO()
            csv.writer(buf, lineterminator="\n").writerows(out)
            record.write_text(buf.getvalue())


def _read_csv(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def _prune_empty(top: Path, keep: set[Path]) -> None:
    for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda t: -len(t[0])):
        d = Path(dirpath)
        if d not in keep and d.is_dir() and not any(d.iterdir()):
            d.rmdir()


def normalize_modes(top: Path) -> tuple[int, int]:
    """Directories 0755, files 0755 when their owner may run them else 0644, whatever the umask
    was. Returns the number of regular files and their total size."""
    files = size = 0
    for dirpath, dirnames, filenames in os.walk(top):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if os.path.islink(path):
                continue
            os.chmod(path, 0o755 if st.st_mode & 0o100 else 0o644)
            files += 1
            size += st.st_size
        dirnames.sort()
    return files, size


def write_venv(root: Path, target: VenvTarget) -> None:
    """The venv itself (``pyvenv.cfg``, ``bin/python*`` links to the image's interpreter, an
    empty site-packages) under ``root``: one small layer of its own."""
    prefix = root / target.rel
    (prefix / "bin").mkdir(parents=True, exist_ok=True)
    (prefix / target.site_packages).mkdir(parents=True, exist_ok=True)
    interp = PurePosixPath(target.interpreter)
    cfg = (
        f"home = {interp.parent}\n"
        "include-system-site-packages = false\n"
        f"version = {target.python_version}\n"
        f"executable = {interp}\n"
    )  # no `command` line: `python -m venv` did not make this venv, envbuild did (VENV_FORMAT 2)
    (prefix / "pyvenv.cfg").write_text(cfg)
    for link, to in (
        ("python", str(interp)),
        ("python3", "python"),
        (f"python{target.python_version}", "python"),
    ):
        dest = prefix / "bin" / link
        if dest.is_symlink() or dest.exists():
            dest.unlink()
        dest.symlink_to(to)
    lib64 = prefix / "lib64"
    if not lib64.is_symlink():
        lib64.symlink_to("lib")
    normalize_modes(root)
