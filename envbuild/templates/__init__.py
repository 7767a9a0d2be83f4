"""The Jinja templates envbuild renders, in this folder (the systemd unit ``vllm.service.j2``, the
``host-setup.sh.j2`` script, ``Dockerfile.j2``), and the one environment they all render with.

The environment: a variable a template names but is not given is an error (StrictUndefined),
never an empty string; nothing is escaped (none of the outputs is HTML); the template's trailing
newline is kept; and block tags leave the text around them alone, so a template that wants a
line without its newline says so with ``-%}``. A module that renders a template gives it the
filters it needs (how a value is quoted for systemd, for a Dockerfile).
"""
