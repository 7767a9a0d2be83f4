"""The build's stages as values: what each returns (:class:`Wheels`, :class:`Layers`,
:class:`Lower`, :class:`Made`), and :func:`stage`, which times a stage and wraps its failure
in a :class:`StageError` of its name. :mod:`.pipeline` runs them in order.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from envbuild.build.layerbuild import LayerInputs
from envbuild.build.manifest import BaseResult, BuildManifest, BuiltLayer
from envbuild.errors import EnvbuildError, StageError


@contextlib.contextmanager
def stage(name: str, timings: dict[str, float] | None = None) -> Iterator[None]:
    """Run a stage: envbuild's own errors and OSErrors come out as a :class:`StageError` of
    the stage's name (one clear line reaches the user), caused by the error itself."""
    start = time.perf_counter()
    try:
        yield
    except StageError:
        raise  # a stage's own stages name themselves
    except (EnvbuildError, OSError) as exc:
        raise StageError(name, exc) from exc
    finally:
        if timings is not None:
            timings[name] = timings.get(name, 0.0) + time.perf_counter() - start


def stage_times(timings: dict[str, float]) -> str:
    """``timings`` (seconds per stage) for the log."""
    return ", ".join(f"{name} {seconds:.2f} s" for name, seconds in timings.items())


@dataclass(frozen=True)
class Layers:
    """The layers stage's value: each layer built, by name, and which were made now."""

    built: dict[str, BuiltLayer] = field(default_factory=dict)
    rebuilt: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)

    def __add__(self, other: Layers) -> Layers:
        return Layers(
            {**self.built, **other.built},
            [*self.rebuilt, *other.rebuilt],
            [*self.reused, *other.reused],
        )


@dataclass(frozen=True)
class Wheels:
    """The fetch stage's value: what every layer is made from (the locked wheels, the files
    fetched, the paths the overlap report leaves out), the overlaps and the report's key."""

    inputs: LayerInputs
    overlaps: list[dict[str, Any]]
    key: str


@dataclass(frozen=True)
class Lower:
    """What the stages below the sources stage made: the base, the wheels and the layers whose
    key the plan knew."""

    base: BaseResult
    wheels: Wheels
    layers: Layers


@dataclass(frozen=True)
class Made:
    """The image stage's value: the build manifest and the SBOM's derivation key."""

    manifest: BuildManifest
    sbom_key: str
