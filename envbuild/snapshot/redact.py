"""Never record a secret. Values are judged by the one rule of :mod:`envbuild.spec.secrets`:
by the name they are stored under (``HF_TOKEN``, ``*_PASSWORD``, ``--api-key`` …:
:func:`~envbuild.spec.secrets.secret_name`) and by their shape (``hf_…``, ``ghp_…``, ``sk-…``, AWS
keys, JWTs: :data:`~envbuild.spec.secrets.TOKENS`), and passwords in URLs. Every replacement is
noted so the manifest can list which fields were redacted."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

from envbuild.snapshot.model.core import REDACTED
from envbuild.spec.secrets import TOKENS, secret_name

log = logging.getLogger(__name__)

_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^/\s:@]+:)(?P<pw>[^/\s@]+)(?=@)")
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class Redactor:
    """Replaces secrets and remembers where (the manifest's ``redacted`` list)."""

    fields: set[str] = field(default_factory=set)

    def _note(self, where: str) -> None:
        self.fields.add(where)

    def value(self, where: str, name: str, value: str) -> str:
        """A value stored under ``name`` (an environment variable, a label)."""
        if value and secret_name(name):
            self._note(where)
            return REDACTED
        return self.text(where, value)

    def text(self, where: str, text: str) -> str:
        """Free text: secret-shaped substrings and URL passwords are replaced."""
        out = TOKENS.sub(REDACTED, text)
        out = _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED, out)
        if out != text:
            self._note(where)
        return out

    def argv(self, where: str, argv: list[str]) -> list[str]:
        """A command line: the value after ``--api-key``/``--token``/…, of ``--token=…`` and of
        ``NAME=…`` when the name says secret; secret-shaped words anywhere."""
        out: list[str] = []
        hide_next = False
        for arg in argv:
            if hide_next:
                out.append(REDACTED)
                self._note(where)
                hide_next = False
                continue
            flag, eq, value = arg.partition("=")
            if eq and value and _VARIABLE.fullmatch(flag) and secret_name(flag):
                out.append(f"{flag}={REDACTED}")
                self._note(where)
                continue
            if flag.startswith("-") and secret_name(flag):
                if eq:
                    out.append(f"{flag}={REDACTED}")
                    self._note(where)
                else:
                    out.append(arg)
                    hide_next = True
                continue
            out.append(self.text(where, arg))
        return out

    def environment(self, where: str, env: dict[str, str]) -> dict[str, str]:
        return {k: self.value(f"{where}.{k}", k, v) for k, v in env.items()}
