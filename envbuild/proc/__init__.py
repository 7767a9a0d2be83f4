"""The one way envbuild runs an external command.

Its code is in :mod:`envbuild.proc.core` and the modules beside it."""
