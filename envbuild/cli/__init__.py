"""The command line: parse, call the core, render the result, map errors to exit codes.

Each command lives in its own module under ``envbuild.cli`` (listed in
:mod:`envbuild.cli.commands`) and exposes ``register(parser)``, which fills in its parser and sets
``func`` to a function ``(args) -> int``; a module is imported only when argv names its command.
Commands never catch envbuild errors themselves: :func:`main` decides how every kind of error looks.
"""
