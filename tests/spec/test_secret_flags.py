"""Secrets in the serve command line: a secret flag's value (the knowledge base's
``secret_flags``: ``--api-key``, ``--hf-token``) must be a ``${VAR}`` reference, and validate
refuses exactly the ``${VAR}`` that build refuses. A table of cases, each checked against both;
what build accepts is parsed back by a real POSIX shell."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from envbuild.build.config import image_config
from envbuild.errors import Severity, UserError
from envbuild.spec import facts
from envbuild.spec.check import check_stack
from envbuild.spec.load import load_spec

LITERAL = "sk-this-is-the-real-key-0123"

# extra_args, [image] TOML, refused by validate at these keys (None: accepted)
CASES = [
    (["--api-key", "${VLLM_API_KEY}"], "", None),
    (["--api-key=${VLLM_API_KEY}"], "", None),
    (["--api_key", "${K1}", "${K2}", "--trust-remote-code"], "", None),
    (["--hf-token"], "", None),  # alone: the token of `hf auth login`
    (["--hf-token", "${HF_TOKEN}"], "", None),
    (["--trust-remote-code"], "", None),
    (["--api-key", LITERAL], "", ["serve.extra_args[1]"]),
    (["--api-key", "short"], "", ["serve.extra_args[1]"]),  # not a known token format
    (["--api-key=" + LITERAL], "", ["serve.extra_args[0]"]),
    (["--api-key", "${K1}", "literal-two"], "", ["serve.extra_args[2]"]),
    (["--api-key", "prefix-${K1}"], "", ["serve.extra_args[1]"]),
    (["--api-key"], "", ["serve.extra_args[0]"]),
    (["--api-key", "--trust-remote-code"], "", ["serve.extra_args[0]"]),
    (["--hf-token", "hf_" + "a" * 34], "", ["serve.extra_args[1]"]),
    (["--chat-template", "${TEMPLATE}"], "", ["serve.extra_args[1]"]),  # not a secret flag
    ([], "env = { TOKEN = '${HF_TOKEN}' }", ["image.env.TOKEN"]),
    ([], "labels = { k = 'a${X}' }", ["image.labels.k"]),
    ([], "cmd = ['python3', '${X}']", ["image.cmd[1]"]),
]


def _spec(repo: Path, extra_args: list[str], image: str) -> Path:
    path = repo / "specs" / "x.toml"
    path.write_text(
        '[base]\nkind = "debian"\n[python]\nversion = "3.11"\n'
        "[resolution]\nexclude_newer = 2025-01-01T00:00:00Z\n"
        '[vllm]\nversion = "0.33.0"\n'
        '[model]\nrepo = "org/model"\nrevision = "' + "a" * 40 + '"\nsize_gb = 1\n'
        f"[serve]\nextra_args = {json.dumps(extra_args)}\n"
        + (f"[image]\n{image}\n" if image else "")
    )
    return path


def _where(key: str) -> str:
    out = ""
    for part in key.split("."):
        out += f"[{part}]" if part.isdigit() else (f".{part}" if out else part)
    return out


def secret_problems(path: Path) -> list[str]:
    loaded = load_spec(path)
    keys = []
    for p in check_stack(loaded):
        if p.severity is Severity.ERROR and p.key.startswith(("serve.extra_args", "image.")):
            keys.append(_where(p.key))
            assert LITERAL not in p.message and "hf_aaaa" not in p.message  # never echoed
    return sorted(set(keys))


@pytest.mark.parametrize(("extra_args", "image", "refused"), CASES)
def test_validate_and_build_agree(repo: Path, extra_args, image, refused) -> None:
    path = _spec(repo, extra_args, image)
    assert secret_problems(path) == (refused or [])
    try:
        config = image_config(load_spec(path).spec, spec_hash="s" * 64, lock_hash="l" * 64)
    except UserError:
        built = False
    else:
        built = True
        text = json.dumps(config.model_dump(mode="json"))
        assert LITERAL not in text or refused
    assert built == (refused is None), "validate and build disagree"
    if built and any("${" in a for a in extra_args):
        assert config.cmd[:2] == ["/bin/sh", "-c"]


def test_the_run_time_command_is_what_sh_runs(repo: Path, tmp_path: Path) -> None:
    """The image's command, parsed by a real /bin/sh: the secret comes from the environment when
    the container starts, every other argument arrives as written, and a missing variable
    stops it before vLLM runs."""
    args = ["--api-key", "${K1}", "${K2}", "--chat-template", "{{ 'it''s' }} $HOME; `x`"]
    path = _spec(repo, args, "")
    cmd = image_config(load_spec(path).spec, spec_hash="s", lock_hash="l").cmd
    assert "secret-one" not in json.dumps(cmd)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "vllm"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    fake.chmod(0o755)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "K1": "secret-one", "K2": "two words"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    got = json.loads(done.stdout)
    assert got[-5:] == ["--api-key", "secret-one", "two words", *args[3:]]
    missing = subprocess.run(
        cmd, env={"PATH": env["PATH"], "K1": "x"}, capture_output=True, text=True, check=False
    )
    assert missing.returncode != 0 and "K2" in missing.stderr and missing.stdout == ""


def test_every_secret_flag_has_a_source() -> None:
    flags = facts.knowledge().secret_flags
    assert {f.flag for f in flags} >= {"--api-key", "--hf-token"}
    assert all("vllm/" in f.source for f in flags)
