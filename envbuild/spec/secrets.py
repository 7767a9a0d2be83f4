"""What a literal secret in a spec looks like: the one rule for every value that reaches the
image config, the unit or a manifest (``image.env``, ``image.labels``, ``image.cmd``,
``serve.env``, ``serve.extra_args``, ``builds.*.env``).

A value is a literal secret when it has a credential's shape (:data:`TOKEN_PATTERNS`), or when it
stands under a name that says "secret" (:func:`secret_name`: ``HF_TOKEN``, ``VLLM_API_KEY``,
``--api-key``, ``--hf-token``, a label ``api_key``) and is not a ``${VAR}`` reference. The
snapshot's redaction (:mod:`envbuild.snapshot.redact`) hides what these same two rules find. In a
command line a name and its value are ``--name value``, ``--name=value`` or ``NAME=value``, and an
argument holding spaces (``sh -c "… --api-key xyz"``) is split into the words a shell would see.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from envbuild.spec.model import SECRET_REF

#: Values that look like a credential pasted in, instead of a ``${VAR}`` reference.
TOKEN_PATTERNS = {
    "a Hugging Face token": re.compile(r"\bhf_[A-Za-z0-9]{20,}"),
    "a GitHub token": re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}|\bgithub_pat_\w{20,}"),
    "an OpenAI-style API key": re.compile(r"\bsk-[A-Za-z0-9_-]{20,}"),
    "an AWS access key": re.compile(r"\bA[KS]IA[0-9A-Z]{16}\b"),
    "a Slack token": re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
    "a JSON Web Token": re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
}
#: Every shape of :data:`TOKEN_PATTERNS` in one pattern (to find or replace them all at once).
TOKENS = re.compile("|".join(f"(?:{p.pattern})" for p in TOKEN_PATTERNS.values()))

#: A name that says its value is a secret: it ends one of these words (``HF_TOKEN``,
#: ``AWS_SECRET_ACCESS_KEY``, ``api-key``, ``GITHUBTOKEN``, ``DB_PASSWORD_FILE``), not at a word
#: that only starts like one (``TOKENIZERS_PARALLELISM``, ``--max-num-batched-tokens``,
#: ``--tokenizer``, a label ``authors``).
SECRET_NAME = re.compile(
    r"(?:TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|SESSION_?KEY"
    r"|CREDENTIALS?|AUTHORIZATION|COOKIE)(?:_|$)"
)


def secret_name(name: str) -> bool:
    """Whether ``name`` (a variable, a label, a flag without its dashes) says "secret"."""
    return bool(SECRET_NAME.search(re.sub(r"[-.]", "_", name.lstrip("-")).upper()))


def literal(value: str) -> bool:
    """A value that is there, and is not one ``${VAR}`` reference (nor a shell's ``$VAR``, which
    a ``sh -c`` command line fills in when the container starts)."""
    text = value.strip()
    return bool(text) and not (
        SECRET_REF.fullmatch(text) or re.fullmatch(r"\$[A-Za-z_][A-Za-z0-9_]*", text)
    )


def token_kind(value: str) -> str | None:
    """What credential ``value`` holds by its shape (``"a Hugging Face token"``), or None."""
    return next((k for k, p in TOKEN_PATTERNS.items() if p.search(value)), None)


@dataclass(frozen=True)
class ArgSecret:
    """A literal secret in a command line: the argument at ``index`` holds it, as the value of
    ``name`` (a flag or a variable)."""

    index: int
    name: str


def _words(arg: str) -> list[str]:
    try:
        return shlex.split(arg)
    except ValueError:  # an unclosed quote: the words around it all the same
        return arg.split()


def arg_secrets(args: Sequence[str], *, skip: frozenset[int] = frozenset()) -> Iterator[ArgSecret]:
    """The literal secrets of a command line, each at the argument that holds it; the arguments
    at ``skip`` are judged elsewhere (the knowledge base's secret flags of ``vllm serve``)."""
    for i, name, value in _pairs(args, depth=0):
        if i not in skip and secret_name(name) and literal(value):
            yield ArgSecret(i, name)


def _pairs(args: Sequence[str], *, depth: int) -> Iterator[tuple[int, str, str]]:
    """(index, name, value) for each ``--name value``, ``--name=value`` and ``NAME=value`` of
    ``args``, also inside an argument a shell would split into words."""
    for i, arg in enumerate(args):
        if depth < 2 and len(words := _words(arg)) > 1:
            yield from ((i, n, v) for _, n, v in _pairs(words, depth=depth + 1))
            continue
        name, eq, value = arg.partition("=")
        if eq and (name.startswith("-") or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)):
            yield i, name, value
        elif arg.startswith("-") and i + 1 < len(args) and not args[i + 1].startswith("-"):
            yield i + 1, arg, args[i + 1]


def named_secret(name: str, value: str) -> str | None:
    """What literal secret a value stored under ``name`` (an env variable, a label) holds: by
    its name, or as a command line in it (``VLLM_ARGS = "--api-key xyz"``); None when none."""
    if secret_name(name) and literal(value):
        return "a literal credential"
    hit = next(arg_secrets([value]), None)
    return f"the value of {hit.name}, a secret," if hit else None
