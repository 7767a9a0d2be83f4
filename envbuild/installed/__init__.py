"""What a venv on disk is: where it lives (:mod:`~envbuild.installed.venv`), where a wheel's
members land in it (:mod:`~envbuild.installed.wheelpaths`), and the RECORD-style hashing of its
files (:mod:`~envbuild.installed.hashing`). Below the build, linkcheck and snapshot, which all
read installed venvs."""
