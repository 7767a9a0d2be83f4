"""The spec stage: a TOML file in, a validated :class:`Spec` and where its values came from."""

from envbuild.spec.load import LoadedSpec, find_root, load_spec
from envbuild.spec.locate import dotted
from envbuild.spec.model import SPEC_VERSION, Spec

__all__ = ["SPEC_VERSION", "LoadedSpec", "Spec", "dotted", "find_root", "load_spec"]
