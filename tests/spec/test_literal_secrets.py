"""Literal secrets wherever a spec value reaches the image config: ``[image] cmd`` (``--api-key
sk-…``, ``--api-key=…``, inside ``sh -c "…"``, ``--hf-token …``, ``HF_TOKEN=… cmd``), labels,
env tables, ``serve.extra_args``. One rule (:mod:`envbuild.spec.secrets`): ``envbuild validate``
refuses each at its file, line and key (exit 2), and build's image config refuses it again.
Names that only start like a secret word (``--tokenizer``, ``TOKENIZERS_PARALLELISM``) pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envbuild.build.config import image_config
from envbuild.errors import ExitCode, UserError
from envbuild.spec.load import load_spec

HEAD = """\
[base]
kind = "debian"
[python]
version = "3.11"
platform = "manylinux_2_36_x86_64"
[resolution]
exclude_newer = 2025-01-15T00:00:00Z
[vllm]
version = "0.33.0"
[model]
repo = "org/model"
revision = "{sha}"
size_gb = 1
[serve]
""".format(sha="a" * 40)


def _cmd(*args: str) -> str:
    return f"[image]\ncmd = {json.dumps(list(args))}"


# (TOML after HEAD, the key refused; None: no secret found)
CASES = [
    (_cmd("vllm", "serve", "org/model", "--api-key", "short-key"), "image.cmd[4]"),
    (_cmd("vllm", "serve", "org/model", "--api-key=abc123"), "image.cmd[3]"),
    (_cmd("vllm", "serve", "org/model", "--api_key", "abc123"), "image.cmd[4]"),
    (_cmd("vllm", "serve", "org/model", "--hf-token", "abc123"), "image.cmd[4]"),
    (_cmd("sh", "-c", "exec vllm serve org/model --api-key abc123"), "image.cmd[2]"),
    (_cmd("sh", "-c", "exec vllm serve org/model --api-key='abc 123'"), "image.cmd[2]"),
    (_cmd("sh", "-c", "HF_TOKEN=abc123 exec vllm serve org/model"), "image.cmd[2]"),
    (_cmd("env", "OPENAI_API_KEY=abc123", "python3", "app.py"), "image.cmd[1]"),
    (_cmd("python3", "app.py", "--password", "hunter2"), "image.cmd[3]"),
    (_cmd("python3", "app.py", "--token", "sk-" + "a" * 24), "image.cmd[3]"),
    ('[image]\nlabels = { api_key = "abc123" }', "image.labels.api_key"),
    ('[image]\nlabels = { "dev.x.hf-token" = "abc123" }', "image.labels.dev.x.hf-token"),
    ('[image]\nlabels = { run = "vllm serve m --api-key abc123" }', "image.labels.run"),
    ('[image]\nenv = { VLLM_API_KEY = "abc123" }', "image.env.VLLM_API_KEY"),
    ('[image]\nenv = { VLLM_ARGS = "--api-key abc123" }', "image.env.VLLM_ARGS"),
    ('[serve.env]\nHF_TOKEN = "abc123"', "serve.env.HF_TOKEN"),
    ('extra_args = ["--api-key", "abc123"]', "serve.extra_args[1]"),
    # not secrets
    (_cmd("vllm", "serve", "org/model", "--tokenizer", "org/tok"), None),
    (_cmd("vllm", "serve", "org/model", "--max-num-batched-tokens", "8192"), None),
    (_cmd("vllm", "serve", "org/model", "--hf-token"), None),  # alone: `hf auth login`'s
    (_cmd("sh", "-c", 'exec vllm serve org/model --api-key "$VLLM_API_KEY"'), None),
    ('[image]\nenv = { TOKENIZERS_PARALLELISM = "false" }', None),
    ('[image]\nlabels = { "org.opencontainers.image.title" = "x" }', None),
    ('extra_args = ["--api-key", "${VLLM_API_KEY}"]', None),
]


def _write(repo: Path, tail: str) -> Path:
    path = repo / "specs" / "x.toml"
    path.write_text(HEAD + tail + "\n", "utf-8")
    return path


def _line(path: Path, key: str) -> int:
    lines = path.read_text("utf-8").splitlines()
    head = key.split(".")[1].split("[", maxsplit=1)[0]
    if key.startswith("serve.env"):
        head = key.split(".")[2]
    return next(i for i, ln in enumerate(lines, 1) if ln.startswith(head) and "=" in ln)


@pytest.mark.parametrize(("tail", "key"), CASES, ids=[c[0].replace("\n", " ") for c in CASES])
def test_literal_secret_refused_at_its_key(cli, repo, tail, key):
    path = _write(repo, tail)
    result = cli("validate", path)
    secret_lines = [ln for ln in result.stderr.splitlines() if "written into the spec" in ln]
    if key is None:
        assert not secret_lines, result.stderr
        return
    assert result.exit_code == ExitCode.USER_ERROR, result.stderr
    want = f"{path}:{_line(path, key)}: {key}: error:"
    assert any(ln.startswith(want) for ln in secret_lines), (want, result.stderr)
    for value in ("abc123", "hunter2", "abc 123"):
        assert value not in result.stderr  # never echoed


@pytest.mark.parametrize(
    ("tail", "key"),
    [c for c in CASES if c[1] and c[1].startswith(("image.", "serve.env"))],
    ids=[
        c[0].replace("\n", " ") for c in CASES if c[1] and c[1].startswith(("image.", "serve.env"))
    ],
)
def test_build_refuses_it_too(repo, tail, key):
    spec = load_spec(_write(repo, tail)).spec
    with pytest.raises(UserError, match="secret"):
        image_config(spec, spec_hash="0" * 64, lock_hash="0" * 64)
