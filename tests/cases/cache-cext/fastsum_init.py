"""fastsum: a compiled add, to prove a cached wheel works where it lands."""

import ctypes
from pathlib import Path

_lib = ctypes.CDLL(str(Path(__file__).with_name("libfastsum.so")))
_lib.fastsum_add.argtypes = (ctypes.c_long, ctypes.c_long)
_lib.fastsum_add.restype = ctypes.c_long


def add(a: int, b: int) -> int:
    return int(_lib.fastsum_add(a, b))
