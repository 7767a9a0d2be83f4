"""The link check: every ELF file of an environment finds its libraries and torch's symbols.

Its code is in :mod:`envbuild.linkcheck.core` and the modules beside it."""
