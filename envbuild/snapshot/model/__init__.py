"""The snapshot manifest: what a machine (or an image) really is, as one versioned JSON document.

Its code is in :mod:`envbuild.snapshot.model.core` and the modules beside it."""
