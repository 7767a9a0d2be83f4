"""How the installed torch was built, as ``torch/version.py`` says (what ``torch.__version__``,
``torch.version.cuda`` and ``torch.version.git_version`` return, and what
``python -m torch.utils.collect_env`` prints), read as text: torch is never imported.

The wheel's own version (``2.11.0``) leaves out the local part (``+cu130``) that PyPI cannot carry;
this is where the CUDA build of a torch wheel is written down."""

from __future__ import annotations

import logging
import os
import re

from envbuild.snapshot.model.pyenv import PythonEnv, TorchBuild

log = logging.getLogger(__name__)

_ASSIGN = re.compile(
    r"^(__version__|cuda|hip|git_version|debug)\s*(?::\s*[^=]+)?=\s*(?:'([^'\n]*)'|\"([^\"\n]*)\"|"
    r"(None|True|False))\s*$",
    re.M,
)
_LIMIT = 64 << 10  # torch's version.py is a few hundred bytes


def read_torch_build(site_packages: list[str]) -> TorchBuild | None:
    for site in site_packages:
        path = os.path.join(site, "torch", "version.py")
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read(_LIMIT)
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("%s: cannot read it: %s", path, exc)
            return None
        found: dict[str, str | None] = {}
        for m in _ASSIGN.finditer(text):
            quoted = m.group(2) if m.group(2) is not None else m.group(3)
            found[m.group(1)] = quoted if quoted is not None else _literal(m.group(4))
        if "__version__" not in found:
            log.warning("%s: no __version__ in it", path)
            return None
        return TorchBuild(
            version=found["__version__"] or "",
            cuda=found.get("cuda"),
            hip=found.get("hip"),
            git_version=found.get("git_version"),
            debug=found.get("debug") == "True",
        )
    return None


def _literal(word: str | None) -> str | None:
    return None if word in (None, "None") else word


def record_torch_build(env: PythonEnv) -> PythonEnv:
    return env.model_copy(update={"torch_build": read_torch_build(env.site_packages)})
