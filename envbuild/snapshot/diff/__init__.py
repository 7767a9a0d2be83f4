"""Comparing two snapshots, or a snapshot and a build manifest, in the spirit of
``nix store diff-closures``: grouped, one line per thing that changed, sizes as deltas.

Each side is first reduced to *facts*: groups (host, GPUs, packages of one environment, files
modified since install …) of subject → text. Two sides differ where a subject's text differs.
Volatile facts (memory in use, free disk, GPU processes) sit in the ``state`` group, which is shown
but never makes the two sides "different". Groups only one side can have (a build manifest has no
host) are listed as not compared, with the reason.

:mod:`.facts` is the vocabulary (:class:`~.facts.Fact`, :class:`~.facts.Side`); :mod:`.machine`,
:mod:`.envfacts` and :mod:`.manifest` reduce a snapshot, its Python environments and a build
manifest to facts; :mod:`.compare` pairs two sides and lists the changes; :mod:`.fleet` puts N
sides in one table by the same rule (a row where any two differ); :mod:`.render` turns them into
lines.
"""
