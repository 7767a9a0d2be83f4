"""Which installed distributions envbuild patched, and with what.

A wheel patched by :mod:`envbuild.sourcebuild.patches` carries ``envbuild-patches.json`` in its
``.dist-info``
(``{"dist", "version", "patches": [{"path", "sha256"}, …]}``, the patches in the order applied).
:func:`record_patches` reads it for every distribution of a scanned environment, so a snapshot
shows the patches and ``envbuild diff`` can compare them with a build manifest's.
"""

from __future__ import annotations

import json
import logging
import os

from pydantic import ValidationError

from envbuild.snapshot.model.pyenv import PatchedDist, PatchFile, PythonEnv
from envbuild.sourcebuild.patches import PATCHES_FILE

log = logging.getLogger(__name__)


def read_patch_record(dist_info: str) -> PatchedDist | None:
    """The patch record in the ``dist_info`` folder, or None when it has none. An unreadable or
    malformed record is logged and treated as none (a snapshot records, it does not judge)."""
    path = os.path.join(dist_info, PATCHES_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("%s: cannot read the patch record: %s", path, exc)
        return None
    try:
        return PatchedDist(
            version=str(data["version"]),
            patches=[PatchFile(path=p["path"], sha256=p["sha256"]) for p in data["patches"]],
        )
    except (KeyError, TypeError, ValidationError) as exc:
        log.warning("%s: not an envbuild patch record (%s)", path, exc)
        return None


def record_patches(env: PythonEnv) -> PythonEnv:
    """``env`` with :attr:`PythonEnv.patches` filled in from its distributions' .dist-info."""
    found: dict[str, PatchedDist] = {}
    for dist in env.distributions:
        for site in env.site_packages:
            folder = os.path.join(site, dist.dist_info)
            if os.path.isdir(folder):
                if (record := read_patch_record(folder)) is not None:
                    found[dist.name] = record
                break
    return env.model_copy(update={"patches": found})
