"""The snapshot hides exactly what the spec refuses as a literal secret: one rule of secret
names and credential shapes (:mod:`envbuild.spec.secrets`) serves both, so a value a spec may
not hold is never recorded, and a value a spec may hold (``--tokenizer org/x``, a label
``authors``) is recorded as it is."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envbuild.snapshot.model.core import REDACTED
from envbuild.snapshot.redact import Redactor
from envbuild.spec.secrets import TOKEN_PATTERNS, arg_secrets, named_secret, secret_name, token_kind

KNOWN = {
    "HF_TOKEN": True,
    "hf_token": True,
    "GITHUBTOKEN": True,
    "AWS_SECRET_ACCESS_KEY": True,
    "DB_PASSWORD": True,
    "api-key": True,
    "--hf-token": True,
    "VLLM_API_KEY": True,
    "TOKENIZERS_PARALLELISM": False,
    "--max-num-batched-tokens": False,
    "--tokenizer": False,
    "org.opencontainers.image.authors": False,
    "CUDA_VISIBLE_DEVICES": False,
}

NAMES = st.sampled_from(sorted(KNOWN)) | st.from_regex(
    r"[A-Za-z][A-Za-z0-9_.-]{0,24}", fullmatch=True
)
WORDS = st.sampled_from(["TOKEN", "SECRET", "API_KEY", "PASSWORD", "AUTHORIZATION", "COOKIE"])
#: names built around the rule's words, so both sides of it are reached often
MIXED = st.builds(
    lambda a, w, b: f"{a}{w}{b}",
    st.sampled_from(["", "HF_", "MY", "X-", "--", "no_"]),
    WORDS | WORDS.map(str.lower),
    st.sampled_from(["", "_FILE", "S", "IZER", "-x", "S_PATH"]),
)
PLAIN = st.from_regex(r"[a-z0-9/.]{1,12}", fullmatch=True)  # no credential's shape


@pytest.mark.parametrize(("name", "secret"), sorted(KNOWN.items()))
def test_known_names(name: str, secret: bool) -> None:
    assert secret_name(name) is secret
    assert (Redactor().value("x", name, "v") == REDACTED) is secret


@settings(max_examples=300, deadline=None)
@given(name=NAMES | MIXED, value=PLAIN)
def test_a_value_under_a_name_is_hidden_exactly_when_the_spec_refuses_it(
    name: str, value: str
) -> None:
    refused = named_secret(name, value) is not None
    assert (Redactor().value("x", name, value) == REDACTED) is refused, name


@settings(max_examples=300, deadline=None)
@given(name=NAMES | MIXED, value=PLAIN, joined=st.booleans())
def test_a_flag_value_is_hidden_exactly_when_the_spec_refuses_it(
    name: str, value: str, joined: bool
) -> None:
    flag = "--" + name.lstrip("-")
    argv = [f"{flag}={value}"] if joined else [flag, value]
    refused = bool(list(arg_secrets(argv)))
    shown = Redactor().argv("x", argv)
    assert (shown != argv) is refused, (argv, shown)


@settings(max_examples=200, deadline=None)
@given(
    token=st.one_of(*(st.from_regex(p, fullmatch=True) for p in TOKEN_PATTERNS.values())),
    before=st.sampled_from(["", "Bearer ", "x=", "key: "]),
)
def test_every_credential_shape_the_spec_knows_is_hidden(token: str, before: str) -> None:
    text = before + token
    assert token_kind(text) is not None
    assert token not in Redactor().text("x", text)


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet="abcdefhksxoAIKSJyz_-.0123456789 ", max_size=60))
def test_free_text_is_changed_exactly_when_it_holds_a_credential_shape(text: str) -> None:
    assert (Redactor().text("x", text) != text) is (token_kind(text) is not None)
