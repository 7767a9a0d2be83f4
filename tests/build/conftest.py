"""Fixtures for the build tests."""

from __future__ import annotations

from support.buildindex import build_index  # noqa: F401
