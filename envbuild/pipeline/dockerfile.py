"""`envbuild dockerfile`: the same image as a Dockerfile, for teams that build with docker and as
the peer of ``envbuild build`` in the benchmark.

The Dockerfile starts FROM the base (``debian:<suite>``, or an image pinned by the digest its
lock records), installs the Debian base lock's packages at their locked versions (the spec's
apt packages when the lock pins none), then the lock's wheels with uv (``--require-hashes``) into
the same venv, and sets the same env, command and labels as
:func:`envbuild.build.config.image_config`.
It has no ``# syntax=`` line: that makes BuildKit fetch a frontend image, and the Dockerfile
uses nothing the built-in frontends (BuildKit's and the classic builder's) lack.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import jinja2
from packaging.utils import canonicalize_name

from envbuild.build.config import image_config
from envbuild.build.manifest import MANIFEST_FILE, BuildManifest
from envbuild.errors import ManifestError, UserError
from envbuild.fsio import atomic_writer, write_atomic
from envbuild.lock.core import find_lock
from envbuild.lock.model import DebianBaseLock, ImageBaseLock, Lock
from envbuild.lock.wheels import select_wheels
from envbuild.pipeline.planner import load_lock
from envbuild.proc import core as proc
from envbuild.sourcebuild.audit import Audit
from envbuild.spec import LoadedSpec
from envbuild.store.core import Store
from envbuild.templates import core as templates

log = logging.getLogger(__name__)

#: Where ``envbuild dockerfile -o FILE`` puts the wheels envbuild built or patched, beside FILE;
#: the Dockerfile COPYs them from there (the build context is FILE's folder).
WHEELS_DIR = "envbuild-wheels"
#: Where it puts the CA bundle of ``$SSL_CERT_FILE`` (:data:`CA_FILE`), which the Dockerfile's
#: install stage COPYs and hands to pip and uv; the image never holds it. The folder is always
#: made (empty without ``$SSL_CERT_FILE``): a COPY of a folder that is not there fails.
CA_DIR = "envbuild-ca"
CA_FILE = "ca.pem"
#: Where it puts a rootfs base's tarball, which the Dockerfile ADDs to ``FROM scratch``.
BASE_DIR = "envbuild-base"


@dataclass(frozen=True)
class StoreWheel:
    """A wheel the Dockerfile cannot get from an index: one ``envbuild build`` built or patched."""

    dist: str
    version: str
    filename: str
    sha256: str
    note: str  # what made it, for a comment


@dataclass(frozen=True)
class Dockerfile:
    """A rendered Dockerfile: its text, what it starts FROM, the requirement lines it installs
    and the wheels its build context must hold (:data:`WHEELS_DIR`)."""

    text: str
    base: str
    requirements: list[str]
    wheels: list[StoreWheel] = field(default_factory=list)
    #: the indexes the requirements come from (the lock's, the first as ``--index-url``)
    index_urls: tuple[str, ...] = ("https://pypi.org/simple",)

    def as_dict(self) -> dict[str, Any]:
        """What ``envbuild dockerfile --json`` prints."""
        return {
            "base": self.base,
            "requirements": self.requirements,
            "dockerfile": self.text,
            "wheels": [asdict(w) for w in self.wheels],
        }


def make_dockerfile(
    loaded: LoadedSpec, *, store: Store, build: Path | None = None, output: Path | None = None
) -> Dockerfile:
    """The Dockerfile of ``loaded`` and its lock (:func:`render_dockerfile`). A spec with source
    builds or patches installs the wheels of its last ``envbuild build``, whose output folder is
    ``build`` (default ``<repo>/images/<spec-name>``) and whose wheels ``store`` holds. With
    ``output``, the Dockerfile is written there and its build context beside it: a rootfs base's
    tarball in :data:`BASE_DIR`, the store's wheels in :data:`WHEELS_DIR`, ``$SSL_CERT_FILE`` in
    :data:`CA_DIR`."""
    lock, lock_hash = load_lock(loaded)
    manifest = read_build_manifest(build or loaded.root / "images" / loaded.name)
    result = render_dockerfile(
        loaded,
        lock,
        lock_hash=lock_hash,
        lock_file=loaded.repo_path(find_lock(loaded)),
        manifest=manifest,
    )
    if output is not None:
        copy_base(loaded, output.parent / BASE_DIR)
        copy_ca_bundle(output.parent / CA_DIR)
        if result.wheels:
            copy_wheels(store, result.wheels, output.parent / WHEELS_DIR)
        write_atomic(output, result.text)
    return result


#: The requirements file ``envbuild lock --export-wheels DIR`` writes into DIR.
REQUIREMENTS = "requirements.txt"


@dataclass(frozen=True)
class Export:
    """What :func:`export_wheels` wrote: the requirements file and the store's wheels."""

    requirements: Path
    wheels: list[Path]
    index_urls: tuple[str, ...]

    def index_args(self) -> str:
        first, *more = self.index_urls
        return " ".join([f"--index-url {first}", *(f"--extra-index-url {u}" for u in more)])

    def pip_command(self, folder: str | None = None) -> str:
        folder = folder or str(self.requirements.parent)
        return (
            f"pip install --no-deps --require-hashes {self.index_args()} --find-links {folder} "
            f"-r {folder}/{REQUIREMENTS}"
        )


def export_wheels(
    loaded: LoadedSpec, *, store: Store, dest: Path, build: Path | None = None
) -> Export:
    """An installable form of ``loaded``'s lock for pip or uv: ``dest``/:data:`REQUIREMENTS`,
    every locked wheel ``name==version --hash=sha256:…`` with the wheels ``envbuild build`` made
    (source builds, patches) in place of their sdists and unpatched wheels, those wheels copied
    into ``dest`` (installed with ``--find-links dest``). The same lines the Dockerfile installs
    (:func:`make_dockerfile`); a spec with source builds needs its ``envbuild build`` first."""
    made = make_dockerfile(loaded, store=store, build=build)
    dest.mkdir(parents=True, exist_ok=True)
    copied = copy_wheels(store, made.wheels, dest) if made.wheels else []
    done = Export(dest / REQUIREMENTS, copied, made.index_urls)
    header = (
        f"# Generated by `envbuild lock --export-wheels` from {loaded.repo_path(loaded.path)} and "
        f"its lock; do not edit.\n# {done.pip_command('<this folder>')}\n"
    )
    write_atomic(done.requirements, header + "".join(f"{line}\n" for line in made.requirements))
    return done


def store_wheels(
    loaded: LoadedSpec, lock_hash: str, manifest: BuildManifest | None
) -> list[StoreWheel]:
    """The source-built and patched wheels of the last ``envbuild build`` of this spec and lock
    (its build manifest): the Dockerfile installs those very wheels rather than building or
    patching anything itself."""
    spec = loaded.spec
    shown = loaded.display(loaded.path)
    if manifest is None:
        raise UserError(
            f"{shown} has source builds or patches; the Dockerfile (and lock --export-wheels) "
            "installs the wheels "
            "`envbuild build` made, and it has not built this spec yet",
            hint=f"run `envbuild build {shown}` first (or pass its output with --build DIR)",
        )
    if manifest.spec_hash != loaded.spec_hash() or manifest.lock_hash != lock_hash:
        raise UserError(
            f"the build manifest of {spec.name} is from another version of the spec or lock",
            hint=f"run `envbuild build {shown}` again",
        )
    out: dict[str, StoreWheel] = {}
    for b in manifest.source_builds:
        flags = " ".join(f"{k}={v}" for k, v in sorted(b.flags.items()))
        sass = ", ".join(Audit.model_validate(b.audit).sass) or "none"
        note = (
            f"built from {b.sdist['name']} (source build {b.key[:12]}) with {flags or 'no flags'}; "
            f"MAX_JOBS {b.max_jobs}; audit SASS {sass}"
        )
        out[b.dist] = StoreWheel(b.dist, b.version, b.wheel, b.wheel_sha256, note)
    for p in manifest.patches:
        names = ", ".join(f"{x['path']} (sha256 {x['sha256'][:12]})" for x in p.patches)
        note = f"{p.source_wheel['name']} patched with {names} (patch {p.key[:12]})"
        if p.dist in out:
            note = f"{out[p.dist].note}; then {note}"
        out[p.dist] = StoreWheel(p.dist, p.patched_version, p.wheel, p.wheel_sha256, note)
    return [out[k] for k in sorted(out)]


def _dq(value: str) -> str:
    """A double-quoted Dockerfile word: backslash, quote and ``$`` escaped."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return f'"{escaped}"'


def _environment() -> jinja2.Environment:
    return templates.environment({"dq": _dq, "json": lambda v: json.dumps(v, ensure_ascii=False)})


def base_ref(loaded: LoadedSpec, lock: Lock | None = None) -> str:
    """What the Dockerfile starts FROM: an image base pinned by the digest its lock records."""
    base = loaded.spec.base
    if base.kind == "debian":
        return f"debian:{base.suite}"
    if base.kind == "image":
        locked = lock.envbuild.base if lock is not None else None
        if isinstance(locked, ImageBaseLock):
            return f"{locked.ref.split('@', 1)[0]}@{locked.digest}"
        return base.ref
    if base.kind == "rootfs":
        return "scratch"
    raise UserError(
        f"a {base.kind} base has no registry reference a Dockerfile could start FROM",
        hint="load it into docker first and use a spec with an [base] kind = 'image'",
    )


def base_tarball(loaded: LoadedSpec) -> Path | None:
    """A rootfs base's tarball (the Dockerfile ADDs it to ``scratch`` from :data:`BASE_DIR`)."""
    base = loaded.spec.base
    return (loaded.path.parent / base.path).resolve() if base.kind == "rootfs" else None


def apt_packages(loaded: LoadedSpec, lock: Lock) -> tuple[list[str], bool]:
    """The apt-get install arguments for a Debian base, and whether they are pinned: every
    package of the base lock as ``name=version`` (and python3-venv, which the Dockerfile needs
    for uv, at its Python's locked version), or the spec's packages when the lock pins none."""
    base = loaded.spec.base
    if base.kind != "debian":
        return [], False
    locked = lock.envbuild.base
    if not isinstance(locked, DebianBaseLock) or not locked.packages:
        return sorted({*base.packages, "python3-venv"}), False
    versions = {p.name: p.version for p in locked.packages}
    pins = dict(versions)
    for name, version in versions.items():  # python3 -> python3-venv, python3.11 -> -venv
        if (
            name == "python3" or re.fullmatch(r"python3\.\d+", name)
        ) and f"{name}-venv" not in pins:
            pins[f"{name}-venv"] = version
    return [f"{name}={pins[name]}" for name in sorted(pins)], True


def render_dockerfile(
    loaded: LoadedSpec,
    lock: Lock,
    *,
    lock_hash: str,
    lock_file: str,
    manifest: BuildManifest | None = None,
) -> Dockerfile:
    """The Dockerfile of ``loaded``. A spec with source builds or patches needs ``manifest``, the
    build manifest of ``envbuild build`` for this spec and lock: the Dockerfile COPYs the wheels
    that build made (see :data:`WHEELS_DIR`) and installs them with their sha256 checked."""
    spec = loaded.spec
    extra: list[StoreWheel] = []
    if lock.envbuild.builds or spec.patches:
        extra = store_wheels(loaded, lock_hash, manifest)
    ours = {w.dist for w in extra}
    built = frozenset(canonicalize_name(b.name) for b in lock.envbuild.builds)
    wheels = [w for w in select_wheels(lock, skip=built) if w.canonical not in ours]
    requirements = [f"{w.canonical}=={w.version} --hash=sha256:{w.sha256}" for w in wheels]
    requirements += [f"{w.dist}=={w.version} --hash=sha256:{w.sha256}" for w in extra]
    requirements.sort()
    config = image_config(spec, spec_hash=loaded.spec_hash(), lock_hash=lock_hash)
    apt, pinned = apt_packages(loaded, lock)
    indexes = [i.url for i in lock.envbuild.indexes]
    tarball = base_tarball(loaded)
    text = (
        _environment()
        .get_template("Dockerfile.j2")
        .render(
            spec_file=loaded.repo_path(loaded.path),
            spec_name=spec.name,
            spec_hash=loaded.spec_hash(),
            lock_file=lock_file,
            lock_hash=lock_hash,
            base_ref=base_ref(loaded, lock),
            apt_pinned=pinned,
            base_tarball=f"{BASE_DIR}/{tarball.name}" if tarball else None,
            apt_packages=apt,
            uv_version=proc.uv_version().split()[1],
            interpreter=spec.python.interpreter,
            venv=spec.python.venv.rstrip("/"),
            index_url=indexes[0] if indexes else "https://pypi.org/simple",
            extra_index_urls=indexes[1:],
            requirements=requirements,
            env=sorted(config.env.items()),
            labels=sorted(config.labels.items()),
            workdir=config.workdir,
            entrypoint=config.entrypoint,
            cmd=config.cmd,
            store_wheels=extra,
            wheels_dir=WHEELS_DIR,
            ca_dir=CA_DIR,
            ca_file=CA_FILE,
        )
    )
    urls = tuple(indexes) or ("https://pypi.org/simple",)
    return Dockerfile(text, base_ref(loaded, lock), requirements, extra, urls)


def copy_base(loaded: LoadedSpec, dest: Path) -> Path | None:
    """Put a rootfs base's tarball into ``dest`` (a hard link where the file system allows)."""
    tarball = base_tarball(loaded)
    if tarball is None:
        return None
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / tarball.name
    target.unlink(missing_ok=True)
    try:
        os.link(tarball, target)
    except OSError:
        shutil.copyfile(tarball, target)
    return target


def copy_ca_bundle(dest: Path) -> Path | None:
    """Make ``dest`` (the Dockerfile's :data:`CA_DIR`) and copy ``$SSL_CERT_FILE`` into it as
    :data:`CA_FILE` when it is set: a file in the build context has no size limit (a build arg
    is one argument of at most 128 KiB, less than a usual bundle)."""
    dest.mkdir(parents=True, exist_ok=True)
    bundle = os.environ.get("SSL_CERT_FILE")
    if not bundle:
        return None
    try:
        with open(bundle, "rb") as f, atomic_writer(dest / CA_FILE, 0o644) as g:
            shutil.copyfileobj(f, g, 1 << 20)
    except OSError as exc:
        raise UserError(
            f"cannot copy $SSL_CERT_FILE ({bundle}) into {dest}: {exc.strerror}",
            hint="point SSL_CERT_FILE at a readable CA bundle, or unset it",
        ) from None
    return dest / CA_FILE


def copy_wheels(store: Store, wheels: list[StoreWheel], dest: Path) -> list[Path]:
    """Copy the store's ``wheels`` into ``dest`` under their file names (for the COPY)."""
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for w in wheels:
        src = store.blob_path(f"sha256:{w.sha256}")
        if not src.is_file():
            raise UserError(
                f"{w.filename} is no longer in the store {store.root} (removed by `envbuild gc`?)",
                hint="run `envbuild build` again; it rebuilds or re-patches it",
            )
        target = dest / w.filename
        with src.open("rb") as f, atomic_writer(target) as g:
            shutil.copyfileobj(f, g, 1 << 20)
        out.append(target)
    return out


def read_build_manifest(folder: Path) -> BuildManifest | None:
    """The build manifest ``envbuild build`` wrote into ``folder``, if any."""
    path = folder / MANIFEST_FILE
    try:
        return BuildManifest.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise ManifestError(f"{path} is not a build manifest of this envbuild: {exc}") from None
