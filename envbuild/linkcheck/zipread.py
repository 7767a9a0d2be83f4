"""One wheel member's bytes, read straight from the zip file and inflated by ISA-L.

:func:`read_member` takes an open wheel and a member's central-directory entry
(:class:`zipfile.ZipInfo`) and returns the member's bytes, checked as :mod:`zipfile` checks
them: the local header's signature and name, the size, the CRC-32 and a whole deflate stream.
It does what ``ZipFile.read`` does for the two methods wheels use (stored, deflated), with
ISA-L's inflater (python-isal, ~1.7x zlib's speed on torch's and NVIDIA's libraries) and its
CRC-32 (~6x); any other method, or an encrypted member, is read by :mod:`zipfile` itself.

Memory is bounded by the member's stated size, and a member cannot state more than deflate can
make of its compressed bytes. Every failure is :class:`zipfile.BadZipFile`.

:func:`keep_heap` is for a worker process that reads many large members and then exits.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import struct
import zipfile
from typing import IO, cast

from isal import isal_zlib

log = logging.getLogger(__name__)

#: What the inflater raises on a bad stream (python-isal's stub calls it an instance).
_INFLATE_ERROR = cast("type[Exception]", isal_zlib.error)

_LOCAL = struct.Struct("<4s22xHH")  # signature, then file name and extra field lengths
_SIGNATURE = b"PK\x03\x04"
#: Deflate makes at most 258 bytes from 2 bits (a length code of a fixed-Huffman block).
_MAX_RATIO = 1032


def read_member(f: IO[bytes], zf: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int) -> bytes:
    """The bytes of member ``info`` of the wheel open as ``zf`` over the file ``f`` (its own
    handle, seekable), at most ``limit`` bytes."""
    size, packed = info.file_size, info.compress_size
    if size > limit:
        raise zipfile.BadZipFile(f"{info.filename} is over {limit} bytes")
    if info.flag_bits & 0x1 or info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        return zf.read(info)  # zipfile's own reader (and its errors)
    f.seek(info.header_offset)
    head = f.read(_LOCAL.size)
    if len(head) != _LOCAL.size:
        raise zipfile.BadZipFile(f"{info.filename}: local header cut short")
    signature, name_len, extra_len = _LOCAL.unpack(head)
    name = f.read(name_len)
    encoding = "utf-8" if info.flag_bits & 0x800 else "cp437"
    if signature != _SIGNATURE or name != info.orig_filename.encode(encoding, "replace"):
        raise zipfile.BadZipFile(f"{info.filename}: local header does not match the directory")
    f.seek(extra_len, 1)
    if info.compress_type == zipfile.ZIP_STORED:
        if packed != size:
            raise zipfile.BadZipFile(f"{info.filename}: stored with two sizes")
        data = f.read(size)
    else:
        if size > max(packed, 1) * _MAX_RATIO:
            raise zipfile.BadZipFile(f"{info.filename}: {size} bytes cannot come of {packed}")
        raw = f.read(packed)
        if len(raw) != packed:
            raise zipfile.BadZipFile(f"{info.filename}: compressed bytes cut short")
        inflater = isal_zlib.decompressobj(-15)
        try:
            data = inflater.decompress(raw, size + 1)  # one byte more: too long is an error
        except _INFLATE_ERROR as exc:
            raise zipfile.BadZipFile(f"{info.filename}: {exc}") from None
        del raw
        if not inflater.eof:
            raise zipfile.BadZipFile(f"{info.filename}: deflate stream cut short or too long")
    if len(data) != size:
        raise zipfile.BadZipFile(f"{info.filename}: {len(data)} bytes, the directory says {size}")
    if isal_zlib.crc32(data) & 0xFFFFFFFF != info.CRC:
        raise zipfile.BadZipFile(f"Bad CRC-32 for file {info.filename!r}")
    return data


_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)


@functools.cache
def keep_heap() -> bool:
    """Have glibc's malloc serve every allocation from its heap and never give freed memory
    back, for the rest of this process: each member's buffers then reuse pages already faulted
    in, where a fresh mapping per buffer has the kernel zero and fault in every page of every
    member again (most of the system time of inflating GBs). Only for a short-lived worker
    process: its heap stays as large as its largest member's buffers until it exits. False
    where the C library has no such knob (not glibc: nothing changes)."""
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
