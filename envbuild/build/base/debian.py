"""A Debian base built with ``mmdebstrap``: pinned to an exact package set, bit for bit.

``resolve`` runs mmdebstrap against the mirror and records what it installed: every package's
name, version, architecture and the sha256 of its .deb (from the signed apt lists, which apt
checked the download against). That list is the :class:`DebianBaseLock`. ``build`` runs
mmdebstrap again with the same options plus an apt preferences file pinning every package to its
locked version (priority 1001), then checks the installed set and hashes against the lock; the
derivation key is the pinned set, so the resolving run's rootfs is also kept as that build.

Reproducibility: ``SOURCE_DATE_EPOCH`` (the env's, else 0) is passed to mmdebstrap, whose cleanup
removes apt lists, caches, logs, ``ldconfig/aux-cache`` and the machine-id; a customize hook
empties ``/etc/resolv.conf`` and writes ``localhost`` to ``/etc/hostname`` (both copied from the
host otherwise). The tarball is then re-packed into a deterministic layer (device nodes under
``/dev`` dropped: the engine provides /dev). For an https mirror apt is given ``$SSL_CERT_FILE``
through a temporary file and config that the customize hook removes: nothing of the host (CA,
proxy) stays in the rootfs.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from envbuild import scratch
from envbuild.build.base.model import DEFAULT_PATH, BaseImage
from envbuild.build.base.tarread import located, open_tar, tar_entries
from envbuild.build.base.tarsafe import Tree
from envbuild.build.image import History, OciImageConfig, layer_history
from envbuild.build.layers import Compression, Layer, compressor_id, source_date_epoch, write_layer
from envbuild.errors import IntegrityError
from envbuild.lock.model import DebianBaseLock, DebianPackageLock
from envbuild.proc import core as proc
from envbuild.store.core import Output, Store

log = logging.getLogger(__name__)

#: Bump when the hooks or the re-packing change what a given package set produces.
RECIPE = 2
KIND = "base-debian"
HINT = "install it (Debian: apt-get install mmdebstrap)"

COLLECT = """#!/bin/sh
# customize hook: record the installed set, make host-copied files reproducible, drop our config
set -eu
root="$1"
out="{out}"
dpkg-query --admindir="$root/var/lib/dpkg" -W \\
    -f='${{db:Status-Abbrev}}\\t${{Package}}\\t${{Version}}\\t${{Architecture}}\\n' \\
    | awk -F'\\t' '$1 ~ /^ii/ {{print $2"\\t"$3"\\t"$4}}' > "$out/packages.tsv"
APT_CONFIG="$MMDEBSTRAP_APT_CONFIG" apt-cache show --no-all-versions \\
    $(awk -F'\\t' '{{print $1"="$2}}' "$out/packages.tsv") > "$out/packages.info"
rm -f "$root/etc/apt/preferences.d/envbuild-pin" "$root/etc/apt/apt.conf.d/00envbuild-ca"
: > "$root/etc/resolv.conf"
printf 'localhost\\n' > "$root/etc/hostname"
"""

SETUP = """#!/bin/sh
# setup hook: pin versions and/or give apt the CA bundle (both removed again by the customize hook)
set -eu
root="$1"
mkdir -p "$root/etc/apt/preferences.d" "$root/etc/apt/apt.conf.d"
{pin}
{ca}
"""


@functools.cache
def _mmdebstrap_version() -> str:
    done = proc.run(["mmdebstrap", "--version"], tool="mmdebstrap", hint=HINT)
    return done.stdout.strip().split()[-1] if done.stdout.strip() else "unknown"


def _inputs(
    spec_base: Any, lock: DebianBaseLock, compression: Compression, sde: int
) -> dict[str, Any]:
    return {
        "recipe": RECIPE,
        "mmdebstrap": _mmdebstrap_version(),
        "suite": lock.suite,
        "mirror": lock.mirror,
        "variant": lock.variant,
        "include": sorted(spec_base.packages),
        "packages": [p.model_dump(mode="json") for p in lock.packages],
        "source_date_epoch": sde,
        "compression": compressor_id(compression),
    }


def _write_script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


#: What mmdebstrap's chroot may take in a scratch folder (a python3 minbase is ~0.2 GB, one
#: with build-essential and git ~0.6 GB).
CHROOT_ESTIMATE = 2 << 30


def _mmdebstrap(
    work: Path, spec_base: Any, pins: list[DebianPackageLock] | None, sde: int
) -> tuple[Path, list[DebianPackageLock]]:
    """Run mmdebstrap into ``work/rootfs.tar``; returns it and the installed package set."""
    bundle = os.environ.get("SSL_CERT_FILE") if spec_base.mirror.startswith("https:") else None
    # apt runs outside (downloads) and inside the chroot: one path valid in both places, under
    # /tmp, which mmdebstrap empties in the chroot at the end (locked: see envbuild.scratch)
    with scratch.temp_dir("ca-") if bundle else contextlib.nullcontext() as ca_dir:
        return _mmdebstrap_run(work, spec_base, pins, sde, bundle, ca_dir)


def _mmdebstrap_run(
    work: Path,
    spec_base: Any,
    pins: list[DebianPackageLock] | None,
    sde: int,
    bundle: str | None,
    ca_dir: Path | None,
) -> tuple[Path, list[DebianPackageLock]]:
    out = work / "out"
    out.mkdir()
    pin_lines, ca_lines = "", ""
    if pins:
        prefs = "".join(
            f"Package: {p.name}\nPin: version {p.version}\nPin-Priority: 1001\n\n" for p in pins
        )
        (out / "pin.pref").write_text(prefs)
        pin_lines = f'cp "{out}/pin.pref" "$root/etc/apt/preferences.d/envbuild-pin"'
    if bundle and ca_dir is not None:
        shutil.copyfile(bundle, ca_dir / "ca.crt")
        ca_lines = (
            f'mkdir -p "$root{ca_dir}" && cp "{ca_dir}/ca.crt" "$root{ca_dir}/ca.crt"\n'
            f"echo 'Acquire::https::CaInfo \"{ca_dir}/ca.crt\";' "
            '> "$root/etc/apt/apt.conf.d/00envbuild-ca"'
        )
    collect = _write_script(out / "collect.sh", COLLECT.format(out=out))
    argv: list[str] = ["mmdebstrap", f"--variant={spec_base.variant}", "--verbose"]
    if spec_base.packages:
        argv.append("--include=" + ",".join(sorted(spec_base.packages)))
    if pin_lines or ca_lines:
        setup = _write_script(out / "setup.sh", SETUP.format(pin=pin_lines, ca=ca_lines))
        argv.append(f"--setup-hook={setup}")
    # SUITE TARGET MIRROR after "--": mmdebstrap's Getopt::Long reads nothing after it as an
    # option (the spec's grammar already refuses a suite or mirror that starts with '-')
    argv += [f"--customize-hook={collect}", "--", spec_base.suite, str(work / "rootfs.tar")]
    argv.append(spec_base.mirror)
    # the chroot (mmdebstrap's TMPDIR) in memory when there is room: see envbuild.scratch
    with scratch.folder(scratch.CHROOT, CHROOT_ESTIMATE) as fast:
        chroot = fast or work
        env = proc.child_env({"SOURCE_DATE_EPOCH": str(sde), "TMPDIR": str(chroot)})
        log.info("building a Debian %s rootfs with mmdebstrap (in %s)", spec_base.suite, chroot)
        proc.run(argv, tool="mmdebstrap", env=env, stream=True, hint=HINT)
    return work / "rootfs.tar", _read_packages(out)


def _read_packages(out: Path) -> list[DebianPackageLock]:
    hashes: dict[tuple[str, str, str], str] = {}
    for stanza in (out / "packages.info").read_text().split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line[:1] not in (" ", "\t") and ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if {"Package", "Version", "Architecture", "SHA256"} <= fields.keys():
            ident = (fields["Package"], fields["Version"], fields["Architecture"])
            hashes[ident] = fields["SHA256"]
    packages = []
    for line in (out / "packages.tsv").read_text().splitlines():
        name, version, arch = line.split("\t")
        sha = hashes.get((name, version, arch))
        if sha is None:
            raise IntegrityError(
                f"mmdebstrap installed {name} {version} ({arch}), which the apt lists do not "
                "describe; cannot pin its .deb"
            )
        packages.append(DebianPackageLock(name=name, version=version, arch=arch, sha256=sha))
    return sorted(packages, key=lambda p: (p.name, p.arch))


def _repack(
    store: Store, tar: Path, compression: Compression, sde: int
) -> tuple[Layer, dict[str, str]]:
    """The rootfs as one layer, and its setuid/setgid files (kept: ``su``, ``passwd``, ``mount``
    need them; recorded, as for every other kind of base)."""
    tree = Tree(f"the mmdebstrap rootfs {tar.name}")
    with located(tree), open_tar(name=tar, tree=tree) as tf:
        entries = tar_entries(tf, tree)
        layer = write_layer(store, entries, compression=compression, mtime=sde)
    return layer, tree.setid()


def _output(repacked: tuple[Layer, dict[str, str]], lock: DebianBaseLock) -> Output:
    layer, setid = repacked
    return Output(
        {"layer": layer.digest},
        {
            "layer": layer.model_dump(mode="json"),
            "lock": lock.model_dump(mode="json"),
            "setid": setid,
        },
    )


def resolve(
    store: Store,
    spec_base: Any,
    *,
    compression: Compression = Compression.ZSTD,
    sde: int | None = None,
) -> DebianBaseLock:
    """Resolve the package set of ``spec_base`` against its mirror: run mmdebstrap once and pin
    what it installed. Its rootfs is stored as the build of the pinned set, with mtimes ``sde``
    (a build's plan's SOURCE_DATE_EPOCH; for ``envbuild lock``, which has no plan, the env's)."""
    sde = (source_date_epoch() or 0) if sde is None else sde
    with store.session(), store.temp_dir(scratch.CHROOT) as work:
        tar, packages = _mmdebstrap(work, spec_base, None, sde)
        lock = DebianBaseLock(
            kind="debian",
            suite=spec_base.suite,
            mirror=spec_base.mirror,
            variant=spec_base.variant,
            include=sorted(set(spec_base.packages)),
            packages=packages,
        )
        inputs = _inputs(spec_base, lock, compression, sde)
        store.realize(KIND, inputs, lambda: _output(_repack(store, tar, compression, sde), lock))
    log.info("Debian %s: %d packages pinned", spec_base.suite, len(packages))
    return lock


def build(
    store: Store,
    spec_base: Any,
    lock: DebianBaseLock | None,
    *,
    compression: Compression = Compression.ZSTD,
    sde: int = 0,
) -> BaseImage:
    """The Debian base of ``spec_base``, built from the exact package set of ``lock`` (resolved
    first when the lock has none, or was made for another suite, mirror, variant or include
    list), every mtime ``sde`` (the plan's SOURCE_DATE_EPOCH)."""
    stale = (
        lock is None
        or not lock.packages
        or (lock.suite, lock.mirror, lock.variant, lock.include)
        != (
            spec_base.suite,
            spec_base.mirror,
            spec_base.variant,
            sorted(set(spec_base.packages)),
        )
    )
    if stale:
        lock = resolve(store, spec_base, compression=compression, sde=sde)
    assert lock is not None
    pinned = lock
    inputs = _inputs(spec_base, pinned, compression, sde)

    def produce() -> Output:
        with store.temp_dir(scratch.CHROOT) as work:
            tar, got = _mmdebstrap(work, spec_base, pinned.packages, sde)
            if got != pinned.packages:
                want = {(p.name, p.version, p.arch, p.sha256) for p in pinned.packages}
                have = {(p.name, p.version, p.arch, p.sha256) for p in got}
                diff = sorted(want ^ have)[:6]
                raise IntegrityError(
                    f"the mirror {pinned.mirror} did not give the locked package set "
                    f"(differences: {diff})",
                    hint="the mirror moved on: relock (envbuild lock), or use a "
                    "snapshot.debian.org mirror",
                )
            return _output(_repack(store, tar, compression, sde), pinned)

    with store.session():
        realized = store.realize(KIND, inputs, produce)
    layer = Layer.model_validate(realized.drv.meta["layer"])
    arch = pinned.packages[0].arch if pinned.packages else "amd64"
    arch = next((p.arch for p in pinned.packages if p.arch != "all"), arch)
    return BaseImage(
        kind="debian",
        key=realized.drv.key,
        layers=[layer],
        config=OciImageConfig(architecture=arch, env={"PATH": DEFAULT_PATH}),
        history=[
            History(
                created_by=layer_history(
                    f"envbuild: debian {pinned.suite} {pinned.variant} (mmdebstrap), "
                    f"{len(pinned.packages)} packages",
                    [f"{p.name}={p.version}" for p in pinned.packages],
                )
            )
        ],
        lock=pinned,
        setid=realized.drv.meta.get("setid"),
    )
