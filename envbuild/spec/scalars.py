"""The spec's scalar types: strings that must be a version, a driver, a compute capability, a
commit sha, a specifier, a distribution name, a requirement, a Hugging Face repo id, an image
pinned by digest, a sha256 or a path. Each is a ``str`` with a validator whose error says what was
expected; :mod:`envbuild.spec.model` and :mod:`envbuild.spec.facts` build their tables of them.

envbuild runs as root, and many of these values reach a command line (mmdebstrap, uv, skopeo,
patch, the vLLM unit): each such value has its own grammar here, strict enough that it can never
be read as an option (none starts with ``-``), split into two words, or cut short (no whitespace
where the tool splits, no control character, no NUL). ``docs/spec.md`` lists the grammars.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from pathlib import PurePosixPath
from typing import Annotated

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import AfterValidator, Field


def _version(value: str) -> str:
    try:
        Version(value)
    except InvalidVersion:
        raise ValueError(f"{value!r} is not a version (expected something like 2.14.0)") from None
    return value


def _driver(value: str) -> str:
    if not re.fullmatch(r"\d{3}(\.\d{1,3}){1,2}", value):
        raise ValueError(f"{value!r} is not an NVIDIA driver version (expected like 590.48.01)")
    return value


def _major_minor(value: str) -> str:
    if not re.fullmatch(r"\d+\.\d+", value):
        raise ValueError(f"{value!r} is not a MAJOR.MINOR version (expected like 13.1)")
    return value


def _cuda_version(value: str) -> str:
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?", value):
        raise ValueError(f"{value!r} is not a CUDA version (expected like 13.1 or 13.1.1)")
    return value


def _compute_capability(value: str) -> str:
    if not re.fullmatch(r"\d{1,2}\.\d", value):
        raise ValueError(f"{value!r} is not a compute capability (expected like 12.0)")
    return value


def _commit_sha(value: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{40}", value):
        raise ValueError(
            f"{value!r} is not a commit sha (expected 40 lowercase hex digits; a branch or tag "
            "moves, a commit does not)"
        )
    return value


def _specifier(value: str) -> str:
    try:
        SpecifierSet(value)
    except InvalidSpecifier:
        raise ValueError(
            f"{value!r} is not a version specifier (expected like '==1.2.3', '>=2,<3' or '')"
        ) from None
    return value


def _dist_name(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", value):
        raise ValueError(f"{value!r} is not a distribution name")
    return value


def _requirement(value: str) -> str:
    try:
        Requirement(value)
    except InvalidRequirement as exc:
        raise ValueError(f"{value!r} is not a requirement: {exc}") from None
    return value


def _hf_repo(value: str) -> str:
    # the hub's own rule: ASCII letters, digits, '_', '.', '-'; no '--' or '..'; 96 at most
    part = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?"
    if (
        not re.fullmatch(rf"{part}/{part}", value, re.ASCII)
        or "--" in value
        or ".." in value
        or len(value) > 96
    ):
        raise ValueError(f"{value!r} is not a Hugging Face repo id (expected like org/name)")
    return value


#: distribution/reference's grammar: [domain[:port]/]path[:tag], lowercase path components.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_DOMAIN = rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:]+\])(?::[0-9]+)?"
IMAGE_NAME = re.compile(
    rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::\w[\w.-]{{0,127}})?", re.ASCII
)


def _image_ref_by_digest(value: str) -> str:
    name, at, digest = value.partition("@")
    if not (at and IMAGE_NAME.fullmatch(name) and re.fullmatch(r"sha256:[0-9a-f]{64}", digest)):
        raise ValueError(
            f"{value!r} is not pinned by digest (expected like "
            "nvcr.io/nvidia/cuda:13.1.0-devel-ubuntu24.04@sha256:<64 hex>); a tag moves, a "
            "digest does not"
        )
    return value


def _sha256(value: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{64}", value):
        raise ValueError(f"{value!r} is not a sha256 (expected 64 lowercase hex digits)")
    return value


def _abs_posix(value: str) -> str:
    _no_control(value, tab=False, newline=False)
    if not PurePosixPath(value).is_absolute() or ".." in PurePosixPath(value).parts:
        raise ValueError(f"{value!r} must be an absolute path inside the image, without '..'")
    # it is written as a word of the Dockerfile's RUN lines and the unit: nothing a shell reads
    if not re.fullmatch(r"[A-Za-z0-9._+@%,:=~/-]+", value, re.ASCII):
        raise ValueError(
            f"{value!r} must be a path of letters, digits and . _ + @ % , : = ~ / - (no spaces "
            "or shell characters)"
        )
    return value


def _quant(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_+-]+", value):
        raise ValueError(f"{value!r} is not a GGUF quant type (expected like Q4_K_M, UD-IQ2_XXS)")
    return value


# --- what reaches a command line ---------------------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _no_control(value: str, *, tab: bool = True, newline: bool = True) -> str:
    """``value`` without NUL (no argv, environment or file name can carry one) and without other
    control characters (except a tab or a newline where ``tab``/``newline`` allow them)."""
    allowed = ("\t" if tab else "") + ("\n" if newline else "")
    bad = next((c for c in _CONTROL.findall(value) if c not in allowed), None)
    if bad is not None:
        raise ValueError(f"{value!r} holds a control character ({bad!r}); write plain text")
    return value


def _text(value: str) -> str:
    return _no_control(value)


def _env_name(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value, re.ASCII):
        raise ValueError(
            f"{value!r} is not an environment variable name (letters, digits and '_', not a "
            "digit first)"
        )
    return value


#: Debian policy 5.6.1: lowercase letters, digits, '+', '-', '.'; two characters at least,
#: starting with a letter or digit.
DEBIAN_PACKAGE = r"[a-z0-9][a-z0-9+.-]+"
#: Debian policy 5.6.12: [epoch:]upstream_version[-debian_revision], upstream starting with a
#: digit; letters, digits and ``. + ~`` (``-`` only before a revision, ``:`` only after an epoch).
DEBIAN_VERSION = r"(?:[0-9]+:)?[0-9][A-Za-z0-9.+~]*(?:-[A-Za-z0-9.+~]+)*"


def _debian_package(value: str) -> str:
    if not re.fullmatch(rf"{DEBIAN_PACKAGE}(?:={DEBIAN_VERSION})?", value, re.ASCII):
        raise ValueError(
            f"{value!r} is not a Debian package (expected a name like python3-dev, optionally "
            "=VERSION like python3=3.11.2-1+b1)"
        )
    return value


def _debian_package_name(value: str) -> str:
    if not re.fullmatch(DEBIAN_PACKAGE, value, re.ASCII):
        raise ValueError(f"{value!r} is not a Debian package name")
    return value


def _debian_version(value: str) -> str:
    if not re.fullmatch(DEBIAN_VERSION, value, re.ASCII):
        raise ValueError(f"{value!r} is not a Debian version")
    return value


def _debian_suite(value: str) -> str:
    # a codename (bookworm), a suite (stable, unstable), with a pocket (bookworm-backports)
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,63}", value, re.ASCII):
        raise ValueError(
            f"{value!r} is not a Debian suite (expected a codename or suite like bookworm, "
            "trixie or bookworm-backports: lowercase letters, digits and '-', not '-' first)"
        )
    return value


#: What a URL may hold: RFC 3986's characters without those a shell reads (``$ ( ) * ! ; &``
#: and quotes: the Dockerfile writes index URLs into a RUN line), without '#' (a comment in
#: sources.list), spaces or control characters. ``${NAME}`` references are checked apart.
_URL_CHARS = re.compile(r"[A-Za-z0-9._~:/?\[\]@+,=%-]+", re.ASCII)


def check_url(value: str, *, refs: bool, example: str = "https://pypi.org/simple") -> str:
    """``value`` as an ``http(s)://host/…`` or ``file:///path`` URL; with ``refs``, ``${NAME}``
    references (filled in from the environment at run time) may stand in it, not first."""
    text = re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}", "x", value) if refs else value
    url = urllib.parse.urlsplit(text) if _URL_CHARS.fullmatch(text) else None
    ok = url is not None and (
        (url.scheme in ("http", "https") and bool(url.hostname) and value.startswith(url.scheme))
        or (url.scheme == "file" and url.path.startswith("/") and value.startswith("file:"))
    )
    if not ok or (url is not None and url.fragment):
        raise ValueError(
            f"{value!r} is not an http(s) or file URL (expected like {example} or "
            "file:///srv/mirror, without spaces, quotes or '#')"
        )
    return value


def _mirror(value: str) -> str:
    return check_url(value, refs=False, example="http://deb.debian.org/debian")


def _index_url(value: str) -> str:
    return check_url(value, refs=True)


def _torch_index(value: str) -> str:
    return value if value == "pypi" else check_url(value, refs=True)


def _hostname(value: str) -> str:
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    label = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    if not re.fullmatch(rf"{label}(?:\.{label})*", value, re.ASCII):
        raise ValueError(f"{value!r} is not an IP address or a host name (like 0.0.0.0)")
    return value


def _word(value: str) -> str:
    """A value that follows an option as its own argument: never read as an option itself."""
    if not re.fullmatch(r"[^\s\x00-\x1f\x7f-][^\s\x00-\x1f\x7f]*", value):
        raise ValueError(
            f"{value!r} must be one word that does not start with '-' (no spaces or control "
            "characters)"
        )
    return value


VersionStr = Annotated[str, AfterValidator(_version)]
DriverVersion = Annotated[str, AfterValidator(_driver)]
MajorMinor = Annotated[str, AfterValidator(_major_minor)]
CudaVersion = Annotated[str, AfterValidator(_cuda_version)]
ComputeCapability = Annotated[str, AfterValidator(_compute_capability)]
CommitSha = Annotated[str, AfterValidator(_commit_sha)]
Specifier = Annotated[str, AfterValidator(_specifier)]
DistName = Annotated[str, AfterValidator(_dist_name)]
RequirementStr = Annotated[str, AfterValidator(_requirement)]
HfRepo = Annotated[str, AfterValidator(_hf_repo)]
ImageRef = Annotated[str, AfterValidator(_image_ref_by_digest)]
Sha256 = Annotated[str, AfterValidator(_sha256)]
ImagePath = Annotated[str, AfterValidator(_abs_posix)]
GgufQuant = Annotated[str, AfterValidator(_quant)]
#: A path relative to the spec file; the loader checks it stays inside the repository.
RepoPath = Annotated[str, Field(min_length=1), AfterValidator(_text)]
#: Free text that reaches an argv, an environment or a file the image or unit holds: no NUL or
#: control character but a tab or a newline.
Text = Annotated[str, AfterValidator(_text)]
EnvName = Annotated[str, AfterValidator(_env_name)]
DebianPackage = Annotated[str, AfterValidator(_debian_package)]
DebianPackageName = Annotated[str, AfterValidator(_debian_package_name)]
DebianVersion = Annotated[str, AfterValidator(_debian_version)]
DebianSuite = Annotated[str, AfterValidator(_debian_suite)]
MirrorUrl = Annotated[str, AfterValidator(_mirror)]
IndexUrl = Annotated[str, AfterValidator(_index_url)]
TorchIndex = Annotated[str, AfterValidator(_torch_index)]
HostName = Annotated[str, AfterValidator(_hostname)]
Word = Annotated[str, AfterValidator(_word)]
