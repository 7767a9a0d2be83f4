"""envbuild's templates render with one environment: every template in envbuild/templates is
rendered by its module through :func:`envbuild.templates.core.environment`, no other module builds a
Jinja environment, and a variable a template is not given is an error."""

from __future__ import annotations

import ast
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import jinja2
import pytest
from conftest import REPO

from envbuild.apply import unit as units
from envbuild.apply.hostsetup import render_host_setup
from envbuild.pipeline.core import load_lock
from envbuild.pipeline.dockerfile import render_dockerfile
from envbuild.spec import load_spec
from envbuild.templates import core as templates

SPECS = REPO / "specs"


def _unit(tmp_path: Path) -> str:
    spec = load_spec(SPECS / "kimi-k25-int4.toml").spec
    gen = tmp_path / "generations" / "3-abc"
    settings = units.ServeSettings(3, gen, gen / "venv", tmp_path / "hf", tmp_path / "s.env")
    return units.render_unit(spec, "0" * 64, settings)


def _host_setup(tmp_path: Path) -> str:
    return render_host_setup(load_spec(SPECS / "kimi-k25-int4.toml"))


def _dockerfile(tmp_path: Path) -> str:
    loaded = load_spec(SPECS / "quickstart.toml")
    lock, lock_hash = load_lock(loaded)
    return render_dockerfile(loaded, lock, lock_hash=lock_hash, lock_file="pylock.toml").text


RENDERERS: dict[str, Callable[[Path], str]] = {
    "vllm.service.j2": _unit,
    "host-setup.sh.j2": _host_setup,
    "Dockerfile.j2": _dockerfile,
}


def test_every_template_has_a_renderer() -> None:
    folder = resources.files("envbuild.templates")
    assert sorted(p.name for p in folder.iterdir() if p.name.endswith(".j2")) == sorted(RENDERERS)


@pytest.mark.parametrize("name", sorted(RENDERERS))
def test_each_template_renders_with_the_one_environment(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rendered: list[str] = []
    made = templates.environment

    def environment(filters: templates.Filters | None = None) -> jinja2.Environment:
        env = made(filters)
        real = env.get_template

        def get_template(template: str, *args: object, **kwargs: object) -> jinja2.Template:
            rendered.append(template)
            return real(template, *args, **kwargs)  # type: ignore[arg-type]

        env.get_template = get_template  # type: ignore[method-assign]
        return env

    monkeypatch.setattr(templates, "environment", environment)
    text = RENDERERS[name](tmp_path)
    assert rendered == [name]
    assert text.endswith("\n") and not text.endswith("\n\n")


def test_a_variable_not_given_is_an_error() -> None:
    with pytest.raises(jinja2.UndefinedError, match="driver"):
        templates.render("host-setup.sh.j2", spec_file="s.toml", spec_name="s", spec_hash="0" * 64)


def test_no_other_module_builds_a_jinja_environment() -> None:
    package = REPO / "envbuild"
    builders = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in {"Environment", "PackageLoader", "FileSystemLoader"}:
                builders.append((str(path.relative_to(package)), name))
    assert builders == [
        ("templates/core.py", "Environment"),
        ("templates/core.py", "PackageLoader"),
    ]
