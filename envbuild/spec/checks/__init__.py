"""The checks of a spec's GPU stack, one module per area. Each check takes the loaded spec and
its target GPUs and yields located problems; :func:`envbuild.spec.check.check_stack` runs all."""
