"""A no-op rebuild told from stats and hashes of its inputs, without running the build.

The full path decides that nothing changed by planning the image from the parsed spec and lock,
asking the store for every derivation and comparing the output folder with the image it would
write (:func:`envbuild.build.outputs.write_outputs`). That is right but costs the import of every
stage and a parse of the whole lock. So each build that leaves an output folder whole writes a
*no-op record* into the store (``noop/<key>.json``, keyed by what was asked: the spec's path and
the options that change the image), saying what the build read and what it wrote:

- ``inputs``: the sha256 of every file the image was made from (the spec and each file it
  extends, its patches, its lock, a base layout's ``index.json``);
- ``fingerprint``: what else decides the output: this envbuild (the stat of each of its files),
  the Python running it and the distributions beside it, the environment (volatile shell
  variables aside) and the stat of each tool a build runs (uv, zstd, mmdebstrap, compilers …);
- ``files``: the stat of every file written into the folder (the folder's root records the
  same), and the image's digest.

:func:`check` answers from that record alone: the folder's commit record (its build manifest)
and every file the build wrote have the stat recorded, blobs hard-linked from the store pass the
store's own check, the root still holds the folder's image and the store every derivation and
blob the root keeps, and every input and the fingerprint are what they were. Any difference, or
anything unreadable, is a "don't know": the caller runs the full build, which decides (and
writes a new record). A record is a cache: a lost one costs one full no-op, never a wrong
answer; a build that will change the folder removes the folder's manifest first, so a build
killed on the way leaves no folder this check calls current.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from envbuild import __version__
from envbuild.fsio import canonical_json, sha256_file, write_atomic
from envbuild.store.blobs import BlobStore, output_root_name
from envbuild.store.stamps import file_stamp

RECORD_FORMAT = 1
MANIFEST_FILE = "build-manifest.json"  # the folder's commit record (envbuild.build.manifest)
#: Tools whose version or build can change what a build writes (layer keys name uv's and the
#: compressor's versions; a Debian base names mmdebstrap's; source builds their compilers').
TOOLS = (
    "uv", "zstd", "pigz", "gzip", "tar", "mmdebstrap", "dpkg", "apt-get", "skopeo", "patch",
    "cc", "c++", "gcc", "g++", "nvcc", "cuobjdump", "docker", "python3",
)  # fmt: skip
#: Environment variables that change with every shell and never reach a build's output; every
#: other variable is part of the fingerprint (one that does not matter costs a full no-op).
VOLATILE_ENV = frozenset(
    {"_", "PWD", "OLDPWD", "SHLVL", "TERM", "COLUMNS", "LINES", "PS1", "PS2", "LS_COLORS",
     "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "WINDOWID", "TMUX_PANE", "HISTFILE"}
)  # fmt: skip


@dataclass(frozen=True)
class Request:
    """What ``envbuild build`` was asked: the spec's path and every option that changes the
    image or where it goes."""

    spec: str
    output: str | None
    compression: str
    docker_archive: bool
    builder: str
    builder_network: str

    @classmethod
    def of(
        cls,
        spec: Path | str,
        output: Path | str | None,
        *,
        compression: str,
        docker_archive: bool,
        builder: str,
        builder_network: str,
    ) -> Request:
        return cls(
            spec=str(Path(spec).absolute().resolve()),
            output=str(Path(output).absolute()) if output is not None else None,
            compression=str(compression),
            docker_archive=docker_archive,
            builder=builder,
            builder_network=builder_network,
        )

    def record_path(self, store_root: Path) -> Path:
        key = hashlib.sha256(canonical_json(asdict(self)).encode()).hexdigest()
        return Path(store_root) / "noop" / f"{key}.json"


@dataclass(frozen=True)
class UpToDate:
    """A folder :func:`check` found current: where it is and its build manifest's bytes."""

    output: Path
    image: str
    manifest: bytes
    sources: list[dict[str, str]]


def fingerprint() -> str:
    """sha256 of what besides the inputs decides a build's output (see the module's text)."""
    h = hashlib.sha256()

    def add(*parts: object) -> None:
        h.update(("\0".join(map(str, parts)) + "\n").encode())

    add("envbuild", __version__, sys.version, sys.executable, _stamp(Path(sys.executable)))
    package = Path(__file__).resolve().parent.parent
    for folder, dirs, files in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if not name.endswith((".pyc", ".pyo")):
                add("file", os.path.relpath(os.path.join(folder, name), package),
                    _stamp(Path(folder, name)))  # fmt: skip
    for entry in sys.path:  # the distributions importable beside envbuild, by name and version
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        add("path", entry, *(n for n in names if n.endswith((".dist-info", ".egg-info", ".pth"))))
    environ = {k: v for k, v in os.environ.items() if k not in VOLATILE_ENV}
    for key in sorted(environ):
        value = environ[key]
        add("env", key, value)
        if value.startswith("/") and os.path.isfile(value):  # $ENVBUILD_NVCC, $SSL_CERT_FILE …
            add("env-file", key, _stamp(Path(value)))
    venv_bin = Path(sys.executable).parent
    for tool in TOOLS:
        for found in (shutil.which(tool), venv_bin / tool):
            if found and os.path.isfile(found):
                add("tool", tool, os.path.realpath(found), _stamp(Path(found)))
    return h.hexdigest()


def inputs_of(files: list[Path]) -> dict[str, str]:
    """The sha256 of each input file by absolute path."""
    return {str(Path(f).absolute()): sha256_file(Path(f)) for f in files}


def write_record(
    store_root: Path,
    request: Request,
    *,
    fingerprint: str,
    inputs: dict[str, str],
    output: Path,
    image: str,
    files: dict[str, str],
    sources: list[dict[str, str]],
) -> None:
    """Record that ``output`` holds ``image`` as built from ``inputs`` under ``fingerprint``
    (both taken before the build read anything), with the stat of every file written there."""
    record = {
        "format": RECORD_FORMAT,
        "request": asdict(request),
        "fingerprint": fingerprint,
        "inputs": inputs,
        "output": str(Path(output).absolute()),
        "image": image,
        "files": files,
        "sources": sources,
    }
    path = request.record_path(store_root)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, canonical_json(record))


def forget(store_root: Path, request: Request) -> None:
    """Drop ``request``'s record (a build is about to change what it describes)."""
    with contextlib.suppress(OSError):
        request.record_path(store_root).unlink()


def check(store_root: Path, request: Request) -> UpToDate | None:
    """The output folder ``request`` names, when its record shows that a build would write
    nothing; None whenever that is not certain."""
    try:
        record = json.loads(request.record_path(store_root).read_bytes())
        return _check(Path(store_root), request, record)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _check(store_root: Path, request: Request, record: dict[str, Any]) -> UpToDate | None:
    if record["format"] != RECORD_FORMAT or record["request"] != asdict(request):
        return None
    out = Path(record["output"])
    files: dict[str, str] = record["files"]
    if MANIFEST_FILE not in files:
        return None
    # the folder: its commit record first, then every file the build wrote, as written
    store = BlobStore(store_root)
    for rel, stamp in files.items():
        path = out / rel
        if _stamp(path) == stamp:
            continue
        blob = rel.startswith("oci/blobs/sha256/") and _linked(store, path, rel.rsplit("/", 1)[1])
        if not blob:  # only a blob the store holds may have another stat (another link to it)
            return None
    manifest = (out / MANIFEST_FILE).read_bytes()
    if _stamp(out / MANIFEST_FILE) != files[MANIFEST_FILE]:
        return None  # written again while it was read
    root = json.loads((store.roots_dir / f"{output_root_name(out)}.json").read_bytes())
    if root.get("image") != record["image"] or root.get("output") != str(out):
        return None
    # what the root keeps is still in the store (the full path would make it again)
    for key in root["derivations"]:
        if not (store.drvs / f"{key}.json").is_file():
            return None
    for digest in root["blobs"]:
        if not store.blob_path(digest).is_file():
            return None
    # what the image was made from
    for path, digest in record["inputs"].items():
        if sha256_file(Path(path)) != digest:
            return None
    if record["fingerprint"] != fingerprint():
        return None
    return UpToDate(out, record["image"], manifest, list(record["sources"]))


def _linked(store: BlobStore, path: Path, hexd: str) -> bool:
    """Whether ``path`` is the store's own blob ``hexd`` (a hard link) and passes the store's
    check (its stat as last hashed, else hashed again now), as the full path asks."""
    try:
        if not os.path.samestat(path.lstat(), store.blob_path(f"sha256:{hexd}").stat()):
            return False
    except OSError:
        return False
    return store.check_blob(f"sha256:{hexd}")


def _stamp(path: Path) -> str | None:
    try:
        return file_stamp(path.lstat())
    except OSError:
        return None
