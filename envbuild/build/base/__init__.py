"""The bottom of an image: a Debian package set, a registry image, a local OCI layout or rootfs.

Use::

    base = build_base(store, loaded, lock.tool.envbuild.base)   # -> BaseImage
    base.layers, base.config, base.history, base.lock           # lock: the BaseLock to record
    resolve_debian(store, spec_base) -> DebianBaseLock           # for ``envbuild lock``

Each kind is a derivation in the store, keyed by what pins it (the Debian package set with its
.deb hashes, the registry manifest digest, the tarball's sha256), so a base is fetched or built
once per store. Reading a base never writes outside its target (:mod:`envbuild.build.base.tarsafe`).
"""
