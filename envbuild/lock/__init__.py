"""The lock stage: a spec in, ``lockfiles/pylock.<spec-name>.toml`` out (PEP 751's file name).

The lock pins everything the spec leaves to a resolver: every Python distribution with the URL,
size and sha256 of each of its files (PEP 751), and in ``[tool.envbuild]`` what envbuild itself
needs: the spec's hash, the target, the source builds (as sdists, with their flags), the patches
with their digests, and the base. Later stages (build, apply, registry) read it with
:func:`read_lock`.

Public API:

* :func:`lock_path` — where a spec's lock lives (and is written);
* :func:`find_lock` — the lock to read: :func:`lock_path`, or for one release the old name
  ``lockfiles/<spec-name>.pylock.toml`` with a warning that says how to rename it;
* :func:`read_lock` — parse and check a lock (:class:`~envbuild.errors.ManifestError` if bad,
  :class:`~envbuild.errors.NewerFormat` if written by a newer envbuild);
* :func:`lock_spec` — resolve with uv and write the lock atomically (the base's entry through a
  :class:`BasePinner`: when a Debian base's package set is resolved with mmdebstrap, reused from
  the previous lock, or left unpinned — see :mod:`envbuild.lock.pin`);
* :func:`check_lock` — does the lock still match the spec, and if not, what changed.
"""
