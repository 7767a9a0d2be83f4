"""Fixtures for the store tests: the source-build fixtures (sdists, nvcc, the Python version)
that ``envbuild store plan/add-wheel`` needs, and the private ``$DOCKER_CONFIG`` the registry
tests use, from the conftests that define them."""

from __future__ import annotations

from registry.conftest import docker_config
from sourcebuild.conftest import nvcc, python_version, sdists

__all__ = ["docker_config", "nvcc", "python_version", "sdists"]
