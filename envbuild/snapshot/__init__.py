"""The snapshot stage: what a machine (or an image) really is, as a versioned manifest.

Its code is in :mod:`envbuild.snapshot.core` and the modules beside it."""
