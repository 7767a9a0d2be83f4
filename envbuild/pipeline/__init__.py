"""envbuild.pipeline: see the modules."""
