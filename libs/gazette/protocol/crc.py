"""CRC-32 as zlib sums it (the same polynomial, the same values), where every appended
or recorded byte is summed: the data path's frames (`frames`) and recovery-log
operations (`gazette.recoverylog.ops`). ISA-L's (the `isal` package, a dependency:
measured ~10 x zlib's speed, 40 against 4 GB/s, on a machine where zlib's CRC-32 was a
third of framing a recorded commit); zlib's where `isal` cannot be imported."""

from __future__ import annotations

import zlib
from collections.abc import Callable

#: ``crc32(data, value=0)``: `data`'s CRC-32 continuing from `value`.
crc32: Callable[[bytes | bytearray | memoryview, int], int]
try:
    from isal import isal_zlib

    crc32 = isal_zlib.crc32
    FAST = True
except ImportError:  # (a platform without its wheel: correct, slower)
    crc32 = zlib.crc32
    FAST = False
