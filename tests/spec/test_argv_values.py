"""Every spec value that reaches a command line has its own grammar, and a value outside it is
refused by ``envbuild validate`` with exit 2 at its file, line and key: a Debian mirror is an
http(s) or file URL, a suite a codename, a package Debian's package-name grammar (with an
optional ``=VERSION``), an index URL a URL, an environment variable a name, and so on
(``envbuild.spec.scalars``). What is accepted is what real specs write."""

from __future__ import annotations

from pathlib import Path

import pytest

from envbuild.errors import ExitCode

HEAD = """\
[base]
kind = "debian"
[python]
version = "3.11"
platform = "manylinux_2_36_x86_64"
[resolution]
exclude_newer = 2025-01-15T00:00:00Z
"""
SERVE = """\
[vllm]
version = "0.33.0"
[model]
repo = "org/model"
revision = "{sha}"
size_gb = 1
""".format(sha="a" * 40)


def _spec(repo: Path, table: str, line: str, *, serve: bool = False) -> Path:
    """HEAD with ``line`` written into ``[table]`` (the line is the file's last: its number is
    the file's length)."""
    text = HEAD + (SERVE if serve else "")
    key = line.split(" = ", 1)[0]
    if table == "model" and f"\n{key} = " in text:  # a key [model] has: this value instead
        start = text.index(f"\n{key} = ") + 1
        text = text[:start] + line + text[text.index("\n", start) :]
    elif f"[{table}]\n" in text:
        text = text.replace(f"[{table}]\n", f"[{table}]\n{line}\n", 1)
    else:
        text += f"[{table}]\n{line}\n"
    path = repo / "specs" / "x.toml"
    path.write_text(text, "utf-8")
    return path


def _line(path: Path, line: str) -> int:
    return path.read_text("utf-8").splitlines().index(line) + 1


# (table, TOML line, dotted key refused); every one validated before these grammars
REFUSED = [
    ("base", 'mirror = "--setup-hook=touch /tmp/x"', "base.mirror"),
    ("base", 'mirror = "http://deb.debian.org/debian bookworm main"', "base.mirror"),
    ("base", 'mirror = "ftp://deb.debian.org/debian"', "base.mirror"),
    ("base", 'mirror = "http://deb.debian.org/debian#x"', "base.mirror"),
    ("base", 'mirror = "file:relative/mirror"', "base.mirror"),
    ("base", 'mirror = "http:///no-host"', "base.mirror"),
    ("base", 'mirror = "http://deb.debian.org/debian\\n"', "base.mirror"),
    ("base", 'suite = "--setup-hook=touch /tmp/x"', "base.suite"),
    ("base", 'suite = "Bookworm"', "base.suite"),
    ("base", 'suite = "bookworm main"', "base.suite"),
    ("base", 'suite = "-bookworm"', "base.suite"),
    ("base", 'suite = ""', "base.suite"),
    ("base", 'packages = ["--foo"]', "base.packages[0]"),
    ("base", 'packages = ["python3", "a b"]', "base.packages[1]"),
    ("base", 'packages = ["==1.0"]', "base.packages[0]"),
    ("base", 'packages = ["a"]', "base.packages[0]"),  # two characters at least
    ("base", 'packages = ["Python3"]', "base.packages[0]"),
    ("base", 'packages = ["python3,--setup-hook=x"]', "base.packages[0]"),
    ("base", 'packages = ["python3=-1"]', "base.packages[0]"),
    ("base", 'packages = ["python3=1.0 x"]', "base.packages[0]"),
    ("resolution", 'index_url = "--index-url=http://evil"', "resolution.index_url"),
    ("resolution", 'index_url = "${INDEX}"', "resolution.index_url"),
    (
        "resolution",
        'extra_index_urls = ["https://a/simple", "-x"]',
        "resolution.extra_index_urls[1]",
    ),
    ("resolution", 'extra_index_urls = ["https://a b/simple"]', "resolution.extra_index_urls[0]"),
    ("resolution", 'index_url = "https://pypi.org/$(id)/simple"', "resolution.index_url"),
    ("resolution", 'extra_index_urls = ["https://a/simple;id"]', "resolution.extra_index_urls[0]"),
    ("resolution", 'extra_index_urls = ["https://a/`id`"]', "resolution.extra_index_urls[0]"),
    ("python", 'venv = "/opt/venv;id"', "python.venv"),
    ("python", 'interpreter = "/usr/bin/python3 -c x"', "python.interpreter"),
    ("torch", 'version = "2.5.0"\ncuda = "cpu"\nindex = "--x"', "torch.index"),
    ("vllm", 'extras = ["--no-deps"]', "vllm.extras[0]"),
    ("vllm", 'extras = ["a]b"]', "vllm.extras[0]"),
    ("image", 'env = { "A B" = "x" }', "image.env.A B"),
    ("image", 'env = { "X;touch /tmp/x" = "1" }', "image.env.X;touch /tmp/x"),
    ("image", 'env = { OK = "a\\u0000b" }', "image.env.OK"),
    ("image", 'cmd = ["python3", "a\\u0000b"]', "image.cmd[1]"),
    ("image", 'labels = { x = "a\\u001bb" }', "image.labels.x"),
    ("image", 'workdir = "/a\\nb"', "image.workdir"),
    (
        "builds.flash-attn",
        'version = "2.8.3"\nenv = { "X=1 Y" = "2" }',
        "builds.flash-attn.env.X=1 Y",
    ),
    ("builds.flash-attn", 'version = "2.8.3"\nenv = { "1X" = "2" }', "builds.flash-attn.env.1X"),
    ("serve", 'host = "--api-key=x"', "serve.host"),
    ("serve", 'host = "0.0.0.0 --x"', "serve.host"),
    ("serve", 'served_model_name = "--api-key"', "serve.served_model_name"),
    ("serve", 'served_model_name = "a b"', "serve.served_model_name"),
    ("serve", 'kv_cache_dtype = "--x"', "serve.kv_cache_dtype"),
    ("serve", 'extra_args = ["--x", "a\\rb"]', "serve.extra_args[1]"),
    ("serve", 'env = { "A-B" = "x" }', "serve.env.A-B"),
    ("model", 'repo = "-org/model"', "model.repo"),
    ("model", 'repo = "org/mödel"', "model.repo"),
    ("model", 'repo = "org/a--b"', "model.repo"),
    ("base", 'kind = "image"\nref = "--x@sha256:' + "a" * 64 + '"', "base.ref"),
    ("base", 'kind = "image"\nref = "Docker.io/X@sha256:' + "a" * 64 + '"', "base.ref"),
    ("patches", 'vllm = ["a\\u0000b.patch"]', "patches.vllm[0]"),
]


@pytest.mark.parametrize(
    ("table", "line", "key"), REFUSED, ids=[r[2] + ":" + r[1] for r in REFUSED]
)
def test_refused_at_its_key(cli, repo, table, line, key):
    serve = table in ("serve", "model", "vllm")
    path = _spec(repo, table, line, serve=serve)
    if table == "base" and line.startswith('kind = "image"'):
        path.write_text(path.read_text().replace('kind = "debian"\n', ""), "utf-8")
    result = cli("validate", path)
    assert result.exit_code == ExitCode.USER_ERROR, result.stderr
    where = f"{path}:{_line(path, line.splitlines()[-1])}: {key}: error:"
    assert where in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


ACCEPTED = [
    ("base", 'mirror = "http://deb.debian.org/debian"'),
    ("base", 'mirror = "https://deb.debian.org/debian/"'),
    ("base", 'mirror = "http://127.0.0.1:3142/debian"'),
    ("base", 'mirror = "http://[::1]:3142/debian"'),
    ("base", 'mirror = "file:///srv/mirror/debian"'),
    ("base", 'suite = "bookworm"'),
    ("base", 'suite = "bookworm-backports"'),
    ("base", 'packages = ["ca-certificates", "python3", "g++", "libstdc++6", "python3.11"]'),
    ("base", 'packages = ["python3=3.11.2-1+b1", "tzdata=2024a-0+deb12u1", "base-files=1:12.4"]'),
    ("resolution", 'index_url = "https://user:${TOKEN}@pypi.example.com/simple"'),
    ("resolution", 'extra_index_urls = ["file:///srv/wheels/simple", "http://127.0.0.1:8080/s"]'),
    ("image", 'env = { HF_HUB_ENABLE_HF_TRANSFER = "1", _X = "a b\\tc" }'),
    ("image", 'labels = { "org.opencontainers.image.description" = "two\\nlines" }'),
    ("serve", 'host = "::"\nserved_model_name = "glm-5"\nkv_cache_dtype = "fp8"'),
    ("serve", 'host = "localhost"'),
]


@pytest.mark.parametrize(("table", "line"), ACCEPTED, ids=[a[1] for a in ACCEPTED])
def test_accepted(cli, repo, table, line):
    path = _spec(repo, table, line, serve=table == "serve")
    result = cli("validate", path)
    errors = [ln for ln in result.stderr.splitlines() if ": error:" in ln]
    assert not errors, result.stderr
