"""The Jinja templates envbuild renders, in this folder (the systemd unit ``vllm.service.j2``, the
``host-setup.sh.j2`` script, ``Dockerfile.j2``), and the one environment they all render with.

Its code is in :mod:`envbuild.templates.core` and the modules beside it."""
