"""envbuild.installed: see the modules."""
