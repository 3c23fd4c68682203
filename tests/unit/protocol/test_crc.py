"""The CRC-32 of frames and recorded operations: zlib's values, from the fast
implementation where it is installed (a dependency)."""

from __future__ import annotations

import random
import zlib

import numpy as np
import pytest

from gazette.protocol import crc


def test_the_fast_crc_is_installed() -> None:
    assert crc.FAST, "isal (a dependency) is not importable: CRC-32s run at zlib's speed"


@pytest.mark.parametrize("size", [0, 1, 7, 64, 4095, 1 << 17, (1 << 20) + 3])
def test_crc32_sums_as_zlib_does(size: int) -> None:
    rnd = random.Random(size)
    data = rnd.randbytes(size)
    start = rnd.randrange(1 << 32)
    for view in (data, bytearray(data), memoryview(data),
                 np.frombuffer(data, np.uint8).data):
        assert crc.crc32(view, 0) == zlib.crc32(data)
        assert crc.crc32(view, start) == zlib.crc32(data, start)
    half = size // 2  # (continued over pieces, as a frame's parts are summed)
    assert crc.crc32(data[half:], crc.crc32(data[:half], 0)) == zlib.crc32(data)
