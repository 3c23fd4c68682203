"""Message UUIDs by the column: producer, clock and flags of many UUIDs at once.

The per-message parse of `gazette.message` costs about a microsecond, which is the whole
budget of a row here; numpy takes the canonical text form (what publishers write) apart
for a whole batch at a time. Anything else is left to the message library (`None`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_LUT = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _LUT[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _LUT[_c] = 10 + _i
_HEX_POS = np.array([i for i in range(36) if i not in (8, 13, 18, 23)])
_DASH_POS = np.array([8, 13, 18, 23])
_ZERO_UUID = "00000000-0000-1000-8000-000000000000"


@dataclass
class UuidColumns:
    """Parts of each row's UUID; `has` is False for rows that carry none."""

    has: np.ndarray
    producer: np.ndarray  # uint64, 48 bits
    clock: np.ndarray  # uint64: 60-bit timestamp << 4 | 4-bit counter
    flags: np.ndarray  # uint16, 10 bits


def _combine(nibbles: np.ndarray) -> np.ndarray:
    out = np.zeros(nibbles.shape[0], dtype=np.uint64)
    for j in range(nibbles.shape[1]):
        out = (out << np.uint64(4)) | nibbles[:, j].astype(np.uint64)
    return out


def parse_text_column(texts: pa.Array) -> UuidColumns | None:
    """The UUIDs of a string column (null or "" for none), or None if any is not in the
    canonical form of a version 1 UUID (the caller then parses row by row)."""
    n = len(texts)
    lengths = pc.fill_null(pc.binary_length(texts), 0).to_numpy(zero_copy_only=False)
    has = lengths != 0
    if not np.all(lengths[has] == 36):
        return None
    filled = pc.if_else(has, texts, pa.scalar(_ZERO_UUID)) if not has.all() else texts
    filled = filled.cast(pa.string())
    offsets = np.frombuffer(filled.buffers()[1], dtype=np.int32)[
        filled.offset:filled.offset + n + 1]
    data = np.frombuffer(filled.buffers()[2], dtype=np.uint8)
    chars = data[offsets[0]:offsets[0] + 36 * n].reshape(n, 36)
    if n and not (chars[:, _DASH_POS] == ord("-")).all():
        return None
    nib = _LUT[chars[:, _HEX_POS]]
    if n and (nib == 255).any():
        return None
    time_low, time_mid = _combine(nib[:, 0:8]), _combine(nib[:, 8:12])
    time_hi, clock_seq, node = _combine(nib[:, 12:16]), _combine(nib[:, 16:20]), _combine(
        nib[:, 20:32])
    if n and not (((time_hi >> np.uint64(12)) == 1) & ((clock_seq >> np.uint64(14)) == 2)
                  | ~has).all():
        return None  # not version 1, or not the RFC 4122 variant
    clock = ((((time_hi & np.uint64(0x0FFF)) << np.uint64(48)) | (time_mid << np.uint64(32))
              | time_low) << np.uint64(4)) | ((clock_seq >> np.uint64(10)) & np.uint64(0xF))
    flags = (clock_seq & np.uint64(0x3FF)).astype(np.uint16)
    return UuidColumns(has, node, clock, flags)


def from_ints(uuids: list[int]) -> UuidColumns:
    """The parts of UUIDs given as ints (0: none), as the message library parsed them."""
    u = np.array([(x >> 64, x & 0xFFFFFFFFFFFFFFFF) for x in uuids],
                 dtype=np.uint64).reshape(-1, 2)
    hi, lo = u[:, 0], u[:, 1]
    has = (hi != 0) | (lo != 0)
    time_low, time_mid = hi >> np.uint64(32), (hi >> np.uint64(16)) & np.uint64(0xFFFF)
    time_hi = hi & np.uint64(0xFFFF)
    clock_seq = lo >> np.uint64(48)
    clock = ((((time_hi & np.uint64(0x0FFF)) << np.uint64(48)) | (time_mid << np.uint64(32))
              | time_low) << np.uint64(4)) | ((clock_seq >> np.uint64(10)) & np.uint64(0xF))
    return UuidColumns(has, lo & np.uint64(0xFFFFFFFFFFFF), clock,
                       (clock_seq & np.uint64(0x3FF)).astype(np.uint16))


def text_of(uuid: int) -> str:
    h = f"{uuid:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
