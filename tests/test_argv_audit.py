"""Every command line envbuild builds from spec values, and what the spec can put into it.

envbuild runs as root: a spec value that a tool reads as an option (``--setup-hook=…`` given
to mmdebstrap as a mirror) runs whatever the spec says. Two halves:

- an inventory: every call of :func:`envbuild.proc.core.run` (and the other ways to start a
  process) in envbuild, found by reading the source, each listed below with the spec values
  that reach its argv. A new call site fails the test until it is listed (after checking its
  argv).
- a fuzz of those spec values (hypothesis): each is refused by ``envbuild validate`` with exit
  2 at its file, line and key, or, accepted, reaches the argv that the real code builds (the
  lock's ``uv pip compile``, the base's ``mmdebstrap``, ``skopeo``, ``uv venv``, a source
  build's ``uv``, the vLLM unit's and the image's command) only as a value: after ``--``, inside
  ``--opt=value``, or as a word that does not start with ``-``; never with a NUL.
"""

from __future__ import annotations

import ast
import contextlib
import os
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.mmdebstrap import need_mmdebstrap
from support.outside_proc import OUTSIDE_PROC

from envbuild.errors import ExitCode, SpecError
from envbuild.proc import core as proc
from envbuild.spec.load import LoadedSpec, load_spec

ENVBUILD = Path(__file__).resolve().parent.parent / "envbuild"

#: Every place that starts a process, by module and function, with how many calls it makes and
#: the spec values that reach their argv ("" for none: tool paths, envbuild's own files, lock
#: digests). The fuzz below drives the ones that take spec values.
INVENTORY: dict[str, tuple[int, str]] = {
    "adopt/serving.py:flag_table": (1, ""),  # the adopted environment's python (--python)
    "apply/servecheck.py:parse_commands": (1, "the unit's argv, on stdin as JSON"),
    "apply/servecheck.py:resolve_models": (1, "the unit's model references, on stdin as JSON"),
    "apply/services.py:Systemctl._run": (1, "unit names: envbuild-<spec name>.service"),
    "apply/services.py:Systemctl.logs": (1, "unit names"),
    "apply/venv.py:create_venv": (1, "python.version as --python="),
    "apply/venv.py:python_available": (1, "python.version, after --"),
    "apply/venv.py:sync": (1, ""),
    "build/base/debian.py:_mmdebstrap_run": (
        1,
        "base.variant, base.packages as --include=, base.suite and base.mirror after --",
    ),
    "build/base/debian.py:_mmdebstrap_version": (1, ""),
    "build/base/registry.py:_raw_manifest": (1, "base.ref as docker://REF@DIGEST"),
    "build/base/registry.py:pull.produce": (1, "base.ref as docker://REF@DIGEST"),
    "build/install.py:install": (1, "python.version, python.platform as --opt="),
    "build/layers.py:_tool_version": (1, ""),
    "build/layers.py:_write": (1, ""),
    "oci/compression.py:open_uncompressed": (1, ""),
    "linkcheck/core.py:demangle": (1, "symbol names, on stdin"),
    "lock/resolve.py:_compile": (
        1,
        "python.version, python.platform, resolution.exclude_newer, index URLs as --opt= (a "
        "secret one after its flag), source build names as --no-binary=",
    ),
    "registry/auth.py:_helper": (1, "a registry host from the command line, on stdin"),
    "registry/transport.py:Skopeo._copy": (1, "references from the command line"),
    "snapshot/cuda.py:read_toolkits": (1, ""),
    "snapshot/pyenv.py:probe": (1, ""),
    "snapshot/systemd.py:read_units": (2, ""),
    "sourcebuild/audit.py:_cuobjdump": (1, ""),
    "sourcebuild/builder.py:HostBuilder.build": (1, ""),
    "sourcebuild/builder.py:HostBuilder.build.step": (
        1,
        "index URLs as --opt= (a secret one after its flag), the sdist's requirements after --; "
        "builds.*.env as the environment (names by their grammar)",
    ),
    "sourcebuild/builder.py:HostBuilder.interpreter": (1, "python.version, after --"),
    "sourcebuild/builder.py:HostBuilder.probe": (1, ""),
    "sourcebuild/container_probe.py:nvcc.run": (1, ""),
    "sourcebuild/container_probe.py:version": (1, ""),
    "sourcebuild/patches.py:apply_patch": (2, "patch paths (absolute) as --input="),
    "sourcebuild/toolchain.py:compiler_version": (1, ""),
    "sourcebuild/toolchain.py:nvcc_info": (3, ""),
    "sourcebuild/toolchain.py:toolkit_home": (1, ""),
}
# Not a process start here, and checked below all the same: the container builder's script
# (sourcebuild/container.py: builds.*.env names by their grammar, values shlex-quoted), the vLLM
# unit's ExecStart (apply/unit.py, each argument quoted for systemd) and the image's command.

_STARTERS = {
    ("proc", "run"),
    ("proc", "filter_bytes"),
    ("proc", "reading"),
    ("subprocess", "run"),
    ("subprocess", "Popen"),
    ("subprocess", "call"),
    ("subprocess", "check_call"),
    ("subprocess", "check_output"),
    ("os", "system"),
    ("os", "popen"),
}


def _call_sites(*, direct_only: bool = False) -> Counter[str]:
    """Every process start in envbuild, by module:function (``direct_only``: only those that
    do not go through proc)."""
    found: Counter[str] = Counter()
    for path in sorted(ENVBUILD.rglob("*.py")):
        rel = path.relative_to(ENVBUILD).as_posix()
        if rel.startswith("proc/"):
            continue  # the one function itself (proc.started) and what it is made of
        tree = ast.parse(path.read_text("utf-8"))

        def visit(node: ast.AST, scope: list[str], rel: str = rel) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    visit(child, [*scope, child.name])
                    continue
                if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
                    owner = child.func.value
                    name = child.func.attr
                    if (
                        isinstance(owner, ast.Name)
                        and not (direct_only and owner.id == "proc")
                        and (
                            (owner.id, name) in _STARTERS
                            or (owner.id == "os" and name.startswith(("exec", "spawn")))
                        )
                    ):
                        found[f"{rel}:{'.'.join(s for s in scope if s[0] != '<')}"] += 1
                visit(child, scope)

        visit(tree, [])
    return found


def test_every_process_start_is_in_the_inventory():
    found = _call_sites()
    listed = {site: count for site, (count, _) in INVENTORY.items()}
    new = {s: n for s, n in found.items() if listed.get(s) != n}
    gone = {s: n for s, n in listed.items() if found.get(s) != n}
    assert not new and not gone, (
        f"process starts not as listed: {new} (in the code), {gone} (in INVENTORY); check what "
        "spec values reach each argv (tests/test_argv_audit.py) and update INVENTORY"
    )


def test_only_the_known_exceptions_start_processes_without_proc():
    direct = {site.split(":")[0] for site in _call_sites(direct_only=True)}
    assert direct == {"sourcebuild/container_probe.py"}, (
        f"{sorted(direct)} start processes without envbuild.proc: use proc.run (or, when it "
        "truly cannot, list it in tests/support/outside_proc.py with why)"
    )
    assert direct <= set(OUTSIDE_PROC)
    # the probe says why in its own docstring, the reason the list gives
    probe = ENVBUILD / "sourcebuild" / "container_probe.py"
    doc = ast.get_docstring(ast.parse(probe.read_text("utf-8"))) or ""
    reason = "cannot import envbuild.proc"
    assert reason in doc and reason in OUTSIDE_PROC["sourcebuild/container_probe.py"]


# --- the fuzz -----------------------------------------------------------------------------------


class _Recorder:
    """Stands in for :func:`proc.run`: records each argv (secrets revealed) and answers as a
    tool that succeeded with a path on stdout (so the code goes on to its next command)."""

    def __init__(self) -> None:
        self.argvs: list[list[str]] = []

    def __call__(self, argv: Sequence[proc.Arg], **_: Any) -> proc.Completed:
        shown = [a.reveal() if isinstance(a, proc.Secret) else os.fspath(a) for a in argv]
        self.argvs.append(shown)
        return proc.Completed(tuple(shown), 0, "/usr/bin/python3\n", "")


def _lock_argvs(loaded: LoadedSpec, tmp: Path) -> None:
    from envbuild.lock.resolve import _compile
    from envbuild.lock.resolvetarget import build_names, requirements_of, resolve_target_of
    from envbuild.lock.sdist import SdistMetadata

    names = build_names(loaded)
    versions = {n: b.version for n, b in loaded.spec.builds.items()}
    empty = {n: SdistMetadata([], None) for n in names}
    target = resolve_target_of(loaded)
    _compile(target, requirements_of(loaded), names, versions, empty, "x", no_deps=False)


def _base_argvs(loaded: LoadedSpec, tmp: Path) -> None:
    base = loaded.spec.base
    if base.kind == "debian":
        from envbuild.build.base.debian import _mmdebstrap_run

        work = tmp / "work"
        work.mkdir()
        _mmdebstrap_run(work, base, None, 0, None, None)
    elif base.kind == "image":
        from envbuild.build.base.registry import _raw_manifest

        ref, _, digest = base.ref.partition("@")
        _raw_manifest(ref, digest, True)


def _venv_argvs(loaded: LoadedSpec, tmp: Path) -> None:
    from envbuild.apply.venv import create_venv, python_available

    python_available(loaded.spec.python.version)
    create_venv(tmp / "venv", loaded.spec.python.version)


def _source_build_argvs(loaded: LoadedSpec, tmp: Path) -> None:
    from envbuild.sourcebuild.builder import BuildJob, HostBuilder

    res = loaded.spec.resolution
    for name, build in loaded.spec.builds.items():
        job = BuildJob(
            dist=name,
            version=build.version,
            sdist=tmp / "x.tar.gz",
            env=dict(build.env),
            requires=["setuptools"],
            index_url=res.index_url,
            extra_index_urls=list(res.extra_index_urls),
            out_dir=tmp / "out",
            work_dir=tmp,
        )
        HostBuilder(loaded.spec.python.version).build(job)


DRIVERS: list[Callable[[LoadedSpec, Path], None]] = [
    _lock_argvs,
    _base_argvs,
    _venv_argvs,
    _source_build_argvs,
]


def _argvs(loaded: LoadedSpec, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Every argv the real code builds from ``loaded``: the process starts recorded, the vLLM
    unit's ExecStart and the image's command as they are."""
    recorder = _Recorder()
    with monkeypatch.context() as m:
        m.setattr(proc, "run", recorder)
        for var in {v for _, v in loaded.spec.secret_refs()}:
            m.setenv(var, "--setup-hook=touch /tmp/x")  # what a secret holds is no spec value
        for i, driver in enumerate(DRIVERS):
            here = tmp / f"d{i}"
            here.mkdir()
            # what the code does with a tool's answer is no matter here: the argvs are
            # recorded (test_the_drivers_reach_every_spec_site shows each driver gets there)
            with contextlib.suppress(Exception):
                driver(loaded, here)
    argvs = list(recorder.argvs)
    spec = loaded.spec
    if spec.serve and spec.model and spec.vllm:
        from envbuild.apply.unit import exec_start
        from envbuild.build.config import vllm_serve_cmd

        argvs.append(exec_start(spec, Path("/venv"), Path("/hub")))
        argvs.append(vllm_serve_cmd(spec))
    return argvs


def _reads_as_option(argv: list[str], i: int) -> bool:
    arg = argv[i]
    if "--" in argv[:i]:
        return False
    return arg.startswith("-")


def _check_value_only(new: list[list[str]], old: list[list[str]], value: str) -> None:
    """Each argument ``new`` holds and ``old`` (the same spec with a plain value) does not is
    the value, never read as an option: inside ``--opt=`` (the option's own name unchanged),
    after ``--``, or not starting with ``-``; and none holds a NUL."""
    assert len(new) == len(old)
    for argv, before in zip(new, old, strict=True):
        was = Counter(before)
        for i, arg in enumerate(argv):
            assert "\0" not in arg, argv
            if was[arg] > 0:
                was[arg] -= 1
                continue
            if arg != value and any(b.startswith(arg + "=") for b in before):
                continue  # the code's own flag, its secret value a separate argument after it
            if arg.startswith("--") and "=" in arg:
                flag = arg.split("=", 1)[0]
                assert any(b.startswith(flag + "=") for b in before), (value, argv)
                continue
            assert not _reads_as_option(argv, i), (value, arg, argv)


SEED: dict[str, Any] = {
    "base": {
        "kind": "debian",
        "suite": "bookworm",
        "mirror": "http://deb.debian.org/debian",
        "packages": ["python3"],
    },
    "python": {"version": "3.11", "platform": "manylinux_2_36_x86_64"},
    "vllm": {"version": "0.33.0"},
    "builds": {"flash-attn": {"version": "2.8.3", "env": {"MAX_JOBS": "2"}}},
    "model": {"repo": "org/model", "revision": "a" * 40, "size_gb": 1},
    "serve": {"served_model_name": "m", "host": "0.0.0.0", "kv_cache_dtype": "auto"},
    "resolution": {
        "exclude_newer": "2025-01-15T00:00:00Z",
        "index_url": "https://pypi.org/simple",
        "extra_index_urls": ["https://example.org/simple"],
    },
}
IMAGE_BASE = {"kind": "image", "ref": "docker.io/library/debian:12@sha256:" + "a" * 64}

#: key path -> what a plain value there looks like (pieces the fuzz mixes with hostile ones)
FUZZED: dict[tuple[str | int, ...], list[str]] = {
    ("base", "suite"): ["bookworm", "-backports"],
    ("base", "mirror"): ["http://deb.debian.org/debian", "file:///srv", "/x"],
    ("base", "packages", 0): ["python3", "=1.0-1", "+b1"],
    ("base", "ref"): ["docker.io/library/debian", ":12", "@sha256:" + "a" * 64],
    ("python", "version"): ["3.11", "3"],
    ("python", "platform"): ["manylinux_2_36_x86_64"],
    ("resolution", "index_url"): ["https://pypi.org/simple", "${TOKEN}", "@host"],
    ("resolution", "extra_index_urls", 0): ["http://127.0.0.1:8080/simple", "${T}"],
    ("builds", "flash-attn", "version"): ["2.8.3", ".post1"],
    ("model", "repo"): ["org/model", "-x", "."],
    ("serve", "served_model_name"): ["glm-5", "/x"],
    ("serve", "host"): ["0.0.0.0", "::1", "localhost"],
    ("serve", "kv_cache_dtype"): ["fp8", "auto"],
}
HOSTILE = [
    "-", "--", "--setup-hook=touch /tmp/x", "-x", " ", "\t", "\0", "\n", "\r", ";", "$(id)",
    "`id`", "=", "==", "|", "&", ",", "#", "'", '"', "\\", "${X}", "%n", "..", ":", "@",
]  # fmt: skip


def _values(pieces: list[str]) -> st.SearchStrategy[str]:
    part = st.one_of(st.sampled_from(pieces), st.sampled_from(HOSTILE), st.text(max_size=4))
    return st.lists(part, min_size=1, max_size=4).map("".join)


cases = st.sampled_from(sorted(FUZZED, key=str)).flatmap(
    lambda key: st.tuples(st.just(key), _values(FUZZED[key]))
)


def _doc(key: tuple[str | int, ...], value: str | None) -> dict[str, Any]:
    doc: dict[str, Any] = _copy(SEED)
    if key[:2] == ("base", "ref"):
        doc["base"] = dict(IMAGE_BASE)
    if value is None:
        return doc
    at: Any = doc
    for part in key[:-1]:
        at = at[part]
    at[key[-1]] = value
    return doc


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _write(repo: Path, doc: dict[str, Any]) -> Path:
    path = repo / "specs" / "x.toml"
    # a TOML date-time, not a string
    text = tomli_w.dumps(doc).replace('"2025-01-15T00:00:00Z"', "2025-01-15T00:00:00Z")
    path.write_text(text, "utf-8")
    return path


def _dotted(key: tuple[str | int, ...]) -> str:
    out = ""
    for part in key:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _line_of_key(path: Path, key: tuple[str | int, ...]) -> int:
    lines = path.read_text("utf-8").splitlines()
    name = next(p for p in reversed(key) if isinstance(p, str))
    table = "[" + ".".join(str(p) for p in key if isinstance(p, str))[: -len(name) - 1] + "]"
    start = lines.index(table)
    return next(i for i in range(start, len(lines)) if lines[i].startswith(f"{name} = ")) + 1


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=cases)
def test_spec_values_reach_argvs_only_as_values(cli, repo, tmp_path_factory, monkeypatch, case):
    key, value = case
    path = _write(repo, _doc(key, value))
    try:
        loaded = load_spec(path)
    except SpecError as exc:
        # refused: exit 2, and located at the key's own line
        result = cli("validate", path)
        assert result.exit_code == ExitCode.USER_ERROR, result.stderr
        want = f"{path}:{_line_of_key(path, key)}: {_dotted(key)}"
        assert any(p.key == _dotted(key) for p in exc.problems), exc.problems
        assert want in result.stderr, (want, result.stderr)
        return
    result = cli("validate", path)
    assert result.exit_code in (ExitCode.OK, ExitCode.USER_ERROR), result.stderr
    plain = load_spec(_write(repo, _doc(key, None)))
    old = _argvs(plain, tmp_path_factory.mktemp("plain"), monkeypatch)
    new = _argvs(loaded, tmp_path_factory.mktemp("fuzzed"), monkeypatch)
    _check_value_only(new, old, value)


def test_the_drivers_reach_every_spec_site(repo, tmp_path, monkeypatch):
    """The fuzz is not vacuous: on the seed spec, the drivers build the argvs of the lock, the
    base, the venv, the source build, the unit and the image (and skopeo for an image base)."""
    argvs = _argvs(load_spec(_write(repo, _doc(("x",), None))), tmp_path, monkeypatch)
    tools = Counter(Path(a[0]).name + (" " + a[1] if len(a) > 1 else "") for a in argvs)
    for want in ("uv pip", "mmdebstrap --variant=essential", "uv python", "uv venv", "vllm serve"):
        assert any(t.startswith(want) for t in tools), tools
    image = _doc(("base", "ref"), None)
    (tmp_path / "i").mkdir()
    argvs = _argvs(load_spec(_write(repo, image)), tmp_path / "i", monkeypatch)
    assert any(Path(a[0]).name == "skopeo" for a in argvs), argvs


def test_real_mmdebstrap_reads_no_option_after_the_separator(tmp_path):
    """Behind the grammar, the argv itself: a mirror that slipped past validation as
    ``--setup-hook=…`` reaches the real mmdebstrap after ``--``, where its Getopt::Long reads
    it as the mirror (apt then fails on it), never as a hook that runs as root."""
    need_mmdebstrap()
    from envbuild.build.base.debian import _mmdebstrap_run
    from envbuild.errors import ToolFailed
    from envbuild.spec.model import DebianBase

    mark = tmp_path / "hook-ran"
    base = DebianBase.model_construct(
        kind="debian",
        suite="bookworm",
        mirror=f"--setup-hook=touch {mark}; exit 1",  # the hook, were it one, stops mmdebstrap
        packages=[],
        variant="essential",
    )
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(ToolFailed):
        _mmdebstrap_run(work, base, None, 0, None, None)
    assert not mark.exists(), "mmdebstrap ran the suite as a setup hook"
