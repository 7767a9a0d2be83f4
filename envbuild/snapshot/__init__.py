"""The snapshot stage: what a machine (or an image) really is, as a versioned manifest.

:func:`take_snapshot` asks each part (host, GPUs, Python environments, CUDA toolkits, Docker,
systemd, the Hugging Face cache) and assembles a
:class:`~envbuild.snapshot.model.core.Snapshot`. Each part reads only what its user can read
and changes nothing.
"""
