"""OCI registries as envbuild's shared store: push an image layout, pull one back, verified.

:func:`push` copies an OCI layout to ``REGISTRY/REPO:TAG`` through a :class:`Transport` (skopeo,
else a Docker engine). Before the copy it asks the registry which blobs it already has, so the
result says how many were uploaded and how many were not sent again; after the copy it checks
that the digest the registry reports for the tag is the layout's manifest digest.

:func:`pull` resolves a tag to a digest, copies that digest into a new layout beside ``DIR``,
checks the manifest digest and the sha256 and size of every blob, and only then moves it to
``DIR``: a corrupt or truncated copy never lands.
"""
