"""The link check: every ELF file of an environment finds its libraries and torch's symbols.

The commonest start-up failure of a GPU Python environment is no resolver conflict but
``libcudart.so.12: cannot open shared object file`` or ``undefined symbol: _ZN3c10…`` from an
extension built against another CUDA or torch than the one installed. This package finds those
before anything runs:

* :mod:`envbuild.linkcheck.elf` reads one file's dynamic-linking facts (pyelftools);
* :mod:`envbuild.linkcheck.reader` reads many in parallel, cached by sha256;
* :mod:`envbuild.linkcheck.check` resolves them over a :class:`~check.Tree` into findings;
* this module makes the tree of a folder on disk (a live venv, a build's extracted
  environment) with the base's library folders and the driver's libraries, and runs the three.
"""
