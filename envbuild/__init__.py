"""envbuild: declarative, reproducible environments for GPU LLM-serving experiments."""

__version__ = "0.1.0"
