"""Never record a secret. Values are judged by the name they are stored under (``HF_TOKEN``,
``*_PASSWORD`` …) and by their shape (``hf_…``, ``ghp_…``, ``sk-…``, AWS keys, JWTs, passwords in
URLs). Every replacement is noted so the manifest can list which fields were redacted."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

from envbuild.snapshot.model import REDACTED

log = logging.getLogger(__name__)

_SECRET_NAME = re.compile(
    r"(TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL|AUTH"
    r"|COOKIE|SESSION_?KEY|SIGNATURE)",
    re.IGNORECASE,
)
_SECRET_VALUE = re.compile(
    r"(\bhf_[A-Za-z0-9]{20,}"
    r"|\bgh[pousr]_[A-Za-z0-9]{20,}"
    r"|\bgithub_pat_[A-Za-z0-9_]{20,}"
    r"|\bsk-[A-Za-z0-9_-]{20,}"
    r"|\bxox[abprs]-[A-Za-z0-9-]{10,}"
    r"|\bA[KS]IA[0-9A-Z]{16}\b"
    r"|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})"
)
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^/\s:@]+:)(?P<pw>[^/\s@]+)(?=@)")
_SECRET_FLAG = re.compile(
    r"^--?[a-z0-9-]*(token|secret|password|passwd|api-key|apikey|access-key|private-key)"
    r"[a-z0-9-]*$",
    re.IGNORECASE,
)


@dataclass
class Redactor:
    """Replaces secrets and remembers where (the manifest's ``redacted`` list)."""

    fields: set[str] = field(default_factory=set)

    def _note(self, where: str) -> None:
        self.fields.add(where)

    def value(self, where: str, name: str, value: str) -> str:
        """A value stored under ``name`` (an environment variable, a label)."""
        if value and _SECRET_NAME.search(name):
            self._note(where)
            return REDACTED
        return self.text(where, value)

    def text(self, where: str, text: str) -> str:
        """Free text: secret-shaped substrings and URL passwords are replaced."""
        out = _SECRET_VALUE.sub(REDACTED, text)
        out = _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED, out)
        if out != text:
            self._note(where)
        return out

    def argv(self, where: str, argv: list[str]) -> list[str]:
        """A command line: the value after ``--api-key``/``--token``/… and ``--token=…``."""
        out: list[str] = []
        hide_next = False
        for arg in argv:
            if hide_next:
                out.append(REDACTED)
                self._note(where)
                hide_next = False
                continue
            flag, eq, _ = arg.partition("=")
            if _SECRET_FLAG.match(flag):
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
