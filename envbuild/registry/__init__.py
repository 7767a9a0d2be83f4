"""OCI registries as envbuild's shared store: push an image layout, pull one back, verified.

Its code is in :mod:`envbuild.registry.core` and the modules beside it."""
