"""The snapshot's models of a Python environment: its distributions and how their files compare
with their RECORDs (modified, missing, added, modes, overlaps), envbuild's patches, the torch
build and what the link check found."""

from __future__ import annotations

import logging
from typing import Literal

from pydantic import Field

from envbuild.snapshot.model.base import Bytes, FileMode, Strict

log = logging.getLogger(__name__)


class ModifiedFile(Strict):
    """A file that differs from its RECORD line: edited since the install, or shipped with a
    RECORD that was already wrong. Both checks (full and quick) judge it the same way and record
    its digest, so a second edit of a file that had already drifted is seen too."""

    path: str
    reason: Literal["sha256", "size"] = Field(
        description="size: the size differs (the digest too); sha256: same size, other bytes"
    )
    expected_size: Bytes | None = None
    actual_size: Bytes
    sha256: str | None = Field(
        default=None, description="hex sha256 of the file on disk (None: an older snapshot)"
    )
    written_after_record: bool | None = Field(
        default=None,
        description="its mtime is later than the RECORD's: changed after the install (False: "
        "the RECORD may have been wrong as shipped)",
    )


class AddedFile(Strict):
    """A file in site-packages that no RECORD lists."""

    path: str
    distribution: str | None = Field(
        description="the distribution owning its folder (None: no single one)"
    )
    folder_owners: list[str] = Field(
        default_factory=list,
        description="when no single distribution owns it: the distributions sharing its folder",
    )
    size: Bytes
    sha256: str | None = Field(description="hex sha256 (None: too big for a quick check)")
    mode: FileMode | None = Field(
        default=None, description="its permission bits (None: an older snapshot)"
    )


class FileModes(Strict):
    """The permission bits of a distribution's files as found (RECORD has none): the mode most
    of them have, and each file with another mode, so that a chmod since the snapshot is named
    while the manifest stays small (most distributions: one mode, or two with their .so files
    or scripts)."""

    usual: FileMode = Field(description="the mode of most files (a tie: the lowest)")
    other: dict[FileMode, list[str]] = Field(
        default_factory=dict,
        description="mode -> the files with that mode, relative to site-packages, sorted",
    )


class Distribution(Strict):
    name: str = Field(description="canonical (PEP 503) name")
    version: str
    installer: str | None = Field(description="the INSTALLER file: pip, uv …")
    dist_info: str = Field(description="the metadata folder, relative to its site-packages")
    record_sha256: str | None = Field(description="sha256 of the RECORD file (None: no RECORD)")
    files: int = Field(description="files RECORD lists")
    size_bytes: Bytes = Field(description="bytes on disk of the listed files that exist")
    modified: list[ModifiedFile] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list)
    unrecorded: list[str] = Field(default_factory=list)
    modes: FileModes | None = Field(
        default=None,
        description="the permission bits of the listed files found (None: an older snapshot, "
        "or no file found; no mode drift is reported for it)",
    )
    files_sha256: str | None = Field(
        default=None,
        description="sha256 of its files as they are on disk, by path (envbuild.snapshot."
        "contents): what two environments' distributions are compared by (None: an older "
        "snapshot, or a file whose digest is not known)",
    )


class Overlap(Strict):
    path: str
    owners: list[str]
    matches: list[str] = Field(
        default_factory=list,
        description="owners whose RECORD line the file on disk matches (all: the same bytes; "
        "none: changed since)",
    )


class PatchFile(Strict):
    path: str = Field(description="the patch as the spec named it, relative to the repository")
    sha256: str


class PatchedDist(Strict):
    """What ``envbuild-patches.json`` in a patched wheel's .dist-info says (see
    :mod:`envbuild.sourcebuild.patches`)."""

    version: str = Field(description="the version before patching")
    patches: list[PatchFile] = Field(description="in the order they were applied")


class LinkFinding(Strict):
    """A file of the environment that will not load (envbuild.linkcheck): a library it needs is
    nowhere, or torch symbols it needs are not exported by the libraries it loads."""

    id: str = Field(description="distribution:library or distribution:symbols")
    kind: Literal["library", "symbols"]
    distribution: str | None
    file: str
    missing: list[str] = Field(description="library names, or C++ mangled symbols")
    demangled: list[str] = Field(default_factory=list, description="the first few, readable")
    looked_in: list[str]
    cause: str
    loaded: bool = Field(
        default=True, description="False: a plugin no import or program loads (noted only)"
    )


class TorchBuild(Strict):
    """What torch/version.py of the installed torch says (torch.__version__, torch.version.*)."""

    version: str = Field(description="torch.__version__, with its local part: 2.11.0+cu130")
    cuda: str | None = Field(default=None, description="the CUDA torch was built with: 13.0")
    hip: str | None = None
    git_version: str | None = None
    debug: bool = False


class PythonEnv(Strict):
    requested: str = Field(description="the --python argument as given")
    executable: str
    prefix: str
    version: str
    implementation: str
    site_packages: list[str]
    integrity: Literal["full", "quick"]
    distributions: list[Distribution]
    overlaps: list[Overlap] = Field(default_factory=list)
    unowned: list[str] = Field(
        default_factory=list,
        description="site-packages files no RECORD lists and no distribution's folder holds",
    )
    added: list[AddedFile] | None = Field(
        default=None,
        description="every file no RECORD lists (unrecorded and unowned) with its size and "
        "digest (None: an older snapshot)",
    )
    torch_build: TorchBuild | None = Field(
        default=None, description="how the installed torch was built (None: no torch)"
    )
    patches: dict[str, PatchedDist] | None = Field(
        default=None,
        description="distributions patched by envbuild, by name (None: not recorded, an older "
        "envbuild)",
    )
    links: list[LinkFinding] | None = Field(
        default=None,
        description="what the link check found (None: not checked, an older envbuild)",
    )
