"""The lock stage: a spec in, ``lockfiles/pylock.<spec-name>.toml`` out (PEP 751's file name).

Its code is in :mod:`envbuild.lock.core` and the modules beside it."""
