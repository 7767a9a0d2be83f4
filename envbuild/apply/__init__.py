"""The apply stage: make a machine run a spec as an immutable, switchable generation.

Modules, one job each: :mod:`~envbuild.apply.paths` (where, under ``--root``),
:mod:`~envbuild.apply.inputs` (spec/snapshot + lock), :mod:`~envbuild.apply.probe` (the machine),
:mod:`~envbuild.apply.preflight` (does it fit; :mod:`~envbuild.apply.hostchecks` checks the
machine, :mod:`~envbuild.apply.checks` is the report), :mod:`~envbuild.apply.stateguard` (one at a
time), :mod:`~envbuild.apply.generations` (the state dir and ``current``),
:mod:`~envbuild.apply.venv` (uv), :mod:`~envbuild.apply.wheels` (store wheels),
:mod:`~envbuild.apply.realize` (realize a generation), :mod:`~envbuild.apply.integrity` (was it
edited), :mod:`~envbuild.apply.modelcache` (huggingface_hub), :mod:`~envbuild.apply.unit` (systemd
unit), :mod:`~envbuild.apply.services` (systemctl), :mod:`~envbuild.apply.health` (vLLM's /health),
:mod:`~envbuild.apply.switch` (the undoable switch, and the recovery of one cut short),
:mod:`~envbuild.apply.journal` (what a switch in progress records), :mod:`~envbuild.apply.record`
(the snapshot beside it), :mod:`~envbuild.apply.manage` (list, rollback, gc),
:mod:`~envbuild.apply.hostsetup` (the driver script) and :mod:`~envbuild.apply.core` (all of it in
order).
"""
