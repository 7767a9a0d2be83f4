"""The one way envbuild runs an external command.

Every subprocess (uv, mmdebstrap, skopeo, nvcc, systemctl …) goes through :func:`run`. It logs the
argv with secrets redacted, captures output (or streams it to the log when asked), and raises
:class:`~envbuild.errors.ToolFailed` quoting the tool's own words when the command fails. A child's
environment is :func:`child_env` (the caller's, without what redirects Python) or, for uv,
:func:`uv_env` (cleaned: only what uv needs, and what may change a result given explicitly).

No child outlives envbuild: each starts through :func:`~envbuild.proc.children.started`, in
a process group of its own, and SIGTERM, SIGINT or SIGHUP stop them all with envbuild
(:mod:`envbuild.proc.children`).
"""
