"""The bottom of an image: a Debian package set, a registry image, a local OCI layout or rootfs.

Its code is in :mod:`envbuild.build.base.core` and the modules beside it."""
