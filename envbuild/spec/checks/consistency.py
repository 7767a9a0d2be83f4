"""Checks that the spec agrees with itself and its base: contradictory pins, literal secrets,
the Debian suite, the wheel platform tag vs the base's glibc, and the Python version."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from envbuild.errors import Problem
from envbuild.spec import facts
from envbuild.spec import knowledge as kb
from envbuild.spec import secrets as sec
from envbuild.spec.checks.core import WARNING, SpecGpu
from envbuild.spec.load import LoadedSpec
from envbuild.spec.locate import KeyPath
from envbuild.spec.model import SECRET_REF, DebianBase


def pins(loaded: LoadedSpec, gpus: list[SpecGpu]) -> Iterator[Problem]:
    """A distribution pinned in two places must be pinned to the same version."""
    spec = loaded.spec
    fixed: dict[str, tuple[str, str]] = {}  # name -> (version, where it is fixed)
    if spec.torch:
        fixed["torch"] = (spec.torch.version, "[torch]")
    if spec.vllm:
        fixed["vllm"] = (spec.vllm.version, "[vllm]")
    for name, build in spec.builds.items():
        fixed[canonicalize_name(name)] = (build.version, f"[builds.{name}]")
    seen: dict[str, str] = {}
    for name, specifier in spec.packages.items():
        key: KeyPath = ("packages", name)
        norm = canonicalize_name(name)
        if norm in seen:
            yield loaded.problem(
                key,
                f"{name!r} is listed twice in [packages] (also as {seen[norm]!r})",
                "keep one of them",
            )
        seen[norm] = name
        yield from _agrees(loaded, key, norm, specifier, fixed)
    for i, text in enumerate(spec.requirements):
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        norm = canonicalize_name(req.name)
        key = ("requirements", i)
        if norm in seen:
            yield loaded.problem(
                key,
                f"{req.name!r} is in both [packages] and requirements",
                "keep one of them",
            )
        yield from _agrees(loaded, key, norm, str(req.specifier), fixed)
    yield from _nvml(loaded)


def _agrees(
    loaded: LoadedSpec,
    key: KeyPath,
    norm: str,
    specifier: str,
    fixed: dict[str, tuple[str, str]],
) -> Iterator[Problem]:
    if norm not in fixed or not specifier:
        return
    version, where = fixed[norm]
    if not SpecifierSet(specifier).contains(Version(version), prereleases=True):
        yield loaded.problem(
            key,
            f"pins {norm} {specifier}, but {where} says {version}",
            f"remove {norm} here; {where} already pins it",
        )


def _nvml(loaded: LoadedSpec) -> Iterator[Problem]:
    """nvidia-ml-py's versions follow the driver (13.590.48 for 590.48.xx)."""
    spec = loaded.spec
    pinned = spec.normalized_packages().get("nvidia-ml-py", "")
    m = re.fullmatch(r"==\s*(\d+)\.(\d+)\.(\d+)", pinned)
    if not spec.host or not m:
        return
    branch, minor = spec.host.driver.split(".")[:2]
    if (m.group(2), m.group(3)) != (branch, minor.lstrip("0") or "0"):
        name = next(n for n in spec.packages if canonicalize_name(n) == "nvidia-ml-py")
        yield loaded.problem(
            ("packages", name),
            f"nvidia-ml-py {pinned} is for driver {m.group(2)}.{m.group(3)}, the host has "
            f"{spec.host.driver}",
            f'pin the release that follows the driver (like "=={m.group(1)}.{branch}.'
            f'{int(minor)}")',
            severity=WARNING,
        )


def secrets(loaded: LoadedSpec, gpus: list[SpecGpu]) -> Iterator[Problem]:
    """A credential must be a ``${VAR}`` reference, never a literal in the spec: not a value
    with a credential's shape anywhere, and not a literal under a name that says "secret"
    (:mod:`envbuild.spec.secrets`) wherever a value reaches the image config, the unit or a
    manifest: env tables and labels by their key, command lines (``image.cmd``,
    ``serve.extra_args``, and env and label values) by their flags and assignments."""
    serve = loaded.spec.serve
    flagged = (
        {("serve", "extra_args", a.index) for a in kb.secret_args(serve.extra_args)}
        if serve
        else set()
    )
    found: dict[KeyPath, tuple[str, str]] = {}  # key -> (what, the variable to use)
    for key, value in _strings(loaded.raw, ()):
        if key in flagged:
            continue  # secret_flags says it better
        kind = sec.token_kind(value)
        if kind is not None:
            env_table = len(key) >= 2 and key[-2] == "env"
            found.setdefault(key, (kind, str(key[-1]) if env_table else "HF_TOKEN"))
    image = loaded.spec.image
    named: list[tuple[KeyPath, str, str]] = [
        *((("image", "env", k), k, v) for k, v in image.env.items()),
        *((("image", "labels", k), k, v) for k, v in image.labels.items()),
        *((("serve", "env", k), k, v) for k, v in (serve.env if serve else {}).items()),
        *(
            (("builds", d, "env", k), k, v)
            for d, b in loaded.spec.builds.items()
            for k, v in b.env.items()
        ),
    ]
    for key, name, value in named:
        if (what := sec.named_secret(name, value)) is not None:
            found.setdefault(key, (what, name))
    lines: list[tuple[KeyPath, list[str], frozenset[int]]] = [
        (("image", "cmd"), list(image.cmd or []), frozenset()),
    ]
    if serve:
        skip = frozenset(i for k in flagged if isinstance(i := k[-1], int))
        lines.append((("serve", "extra_args"), list(serve.extra_args), skip))
    for where, args, skip in lines:
        for hit in sec.arg_secrets(args, skip=skip):
            found.setdefault(
                (*where, hit.index), (f"the value of {hit.name}, a secret,", _var(hit.name))
            )
    for key, (kind, var) in sorted(found.items(), key=lambda kv: str(kv[0])):
        yield loaded.problem(
            key,
            f"this looks like {kind} written into the spec; it would end up in the lock, the "
            "image and the manifests",
            f'reference the environment instead: "${{{var}}}" (and revoke the exposed token); '
            "in the image's command pass it at run time ([serve.env], `docker run -e`)",
        )


def _var(flag: str) -> str:
    """The variable a secret flag's value would come from: ``--hf-token`` -> HF_TOKEN."""
    return re.sub(r"[^A-Z0-9_]", "_", flag.lstrip("-").upper()) or "SECRET"


def secret_flags(loaded: LoadedSpec, gpus: list[SpecGpu]) -> Iterator[Problem]:
    """The value of a flag that takes a secret (the knowledge base's ``secret_flags``) is a
    ``${VAR}`` reference, never a literal; and no other ``${VAR}`` stands where build refuses
    it, in what lands in the image (``image.env``, ``image.cmd``, ``image.labels``,
    ``serve.extra_args``): build leaves only ``[serve.env]`` and secret flags for run time."""
    serve = loaded.spec.serve
    args = list(serve.extra_args) if serve else []
    secret = kb.secret_args(args)
    for arg in secret:
        key: KeyPath = ("serve", "extra_args", arg.index)
        ref = f'"{arg.flag.flag}=${{{arg.flag.env}}}"' if arg.inline else f'"${{{arg.flag.env}}}"'
        if arg.value is None:
            yield loaded.problem(
                key, f"{arg.flag.flag} takes a value, and none follows", f"add {ref} after it"
            )
        elif not SECRET_REF.fullmatch(arg.value):
            yield loaded.problem(
                key,
                f"the value of {arg.flag.flag} is a secret written into the spec; it would end up "
                "in the image's command, the unit and the manifests",
                f"reference the environment instead: {ref} (and revoke the exposed value)",
            )
    allowed = {a.index for a in secret}
    image = loaded.spec.image
    places: list[tuple[KeyPath, str]] = [
        *((("image", "env", k), v) for k, v in image.env.items()),
        *((("image", "labels", k), v) for k, v in image.labels.items()),
        *((("image", "cmd", i), v) for i, v in enumerate(image.cmd or [])),
        *((("serve", "extra_args", i), v) for i, v in enumerate(args) if i not in allowed),
    ]
    for key, value in places:
        if m := SECRET_REF.search(value):
            yield loaded.problem(
                key,
                f"references ${{{m.group(1)}}}, which would put a secret into the image "
                "(build refuses it)",
                "pass secrets at run time through [serve.env] or a secret flag's value in "
                "serve.extra_args (they stay out of the image), or `docker run -e`",
            )


def _strings(value: Any, key: KeyPath) -> Iterator[tuple[KeyPath, str]]:
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, (*key, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, (*key, i))


def platform(loaded: LoadedSpec, gpus: list[SpecGpu]) -> Iterator[Problem]:
    spec = loaded.spec
    base = spec.base
    tag = spec.python.platform
    suite = kb.debian(base.suite) if isinstance(base, DebianBase) else None
    if isinstance(base, DebianBase) and suite is None:
        known = ", ".join(f.suite for f in facts.knowledge().debian)
        yield loaded.problem(
            ("base", "suite"),
            f"envbuild does not know Debian suite {base.suite!r} (knows {known}); its glibc "
            "and python3 are unknown",
            "use a known suite, or add it to envbuild/spec/knowledge.toml",
            severity=WARNING,
        )
    if kb.target_platform(spec) is None:
        what = (
            f"Debian {base.suite}"
            if isinstance(base, DebianBase)
            else f"a base of kind {base.kind!r}"
        )
        yield loaded.problem(
            ("python", "platform"),
            f"the wheel platform tag cannot be derived from {what}",
            'set python.platform (like "manylinux_2_36_x86_64" for glibc 2.36)',
        )
    if suite is None:
        return
    if tag is not None:
        need = kb.platform_glibc(tag)
        have = tuple(int(p) for p in suite.glibc.split("."))
        if need is None:
            yield loaded.problem(
                ("python", "platform"),
                f"{tag} is not a glibc platform tag; Debian {suite.suite} uses glibc {suite.glibc}",
                f'set platform = "{kb.derived_platform(spec)}" or leave it out',
            )
        elif need > have:
            yield loaded.problem(
                ("python", "platform"),
                f"{tag} needs glibc {need[0]}.{need[1]}, but Debian {suite.suite} has glibc "
                f"{suite.glibc}: such wheels would not load",
                f'set platform = "{kb.derived_platform(spec)}" or leave it out',
            )
        elif need < have:
            yield loaded.problem(
                ("python", "platform"),
                f"{tag} is older than Debian {suite.suite}'s glibc {suite.glibc}: wheels built "
                "for a newer glibc are excluded (vLLM needs some, e.g. llguidance's)",
                f'leave platform out to use "{kb.derived_platform(spec)}"',
                severity=WARNING,
            )
    if spec.python.interpreter == "/usr/bin/python3" and spec.python.version != suite.python:
        yield loaded.problem(
            ("python", "version"),
            f"Debian {suite.suite}'s /usr/bin/python3 is {suite.python}, not {spec.python.version}",
            f'set python.version = "{suite.python}", or a suite with Python {spec.python.version}',
        )
