"""The Jinja templates envbuild renders, in this folder (the systemd unit ``vllm.service.j2``, the
``host-setup.sh.j2`` script, ``Dockerfile.j2``), and the one environment they all render with.

The environment: a variable a template names but is not given is an error (StrictUndefined),
never an empty string; nothing is escaped (none of the outputs is HTML); the template's trailing
newline is kept; and block tags leave the text around them alone, so a template that wants a
line without its newline says so with ``-%}``. A module that renders a template gives it the
filters it needs (how a value is quoted for systemd, for a Dockerfile).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jinja2

Filters = Mapping[str, Callable[..., Any]]


def environment(filters: Filters | None = None) -> jinja2.Environment:
    """The environment envbuild's templates render with, with ``filters`` added."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("envbuild.templates", "."),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    env.filters.update(filters or {})
    return env


def render(name: str, filters: Filters | None = None, /, **variables: Any) -> str:
    """Template ``name`` of this folder rendered with ``variables`` (and ``filters``)."""
    return environment(filters).get_template(name).render(**variables)
