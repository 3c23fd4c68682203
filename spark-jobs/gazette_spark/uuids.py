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

_DASH_POS = np.array([8, 13, 18, 23])
_ZERO_UUID = "00000000-0000-1000-8000-000000000000"


@dataclass
class UuidColumns:
    """Parts of each row's UUID; `has` is False for rows that carry none."""

    has: np.ndarray
    producer: np.ndarray  # uint64, 48 bits
    clock: np.ndarray  # uint64: 60-bit timestamp << 4 | 4-bit counter
    flags: np.ndarray  # uint16, 10 bits


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
    chars = data[offsets[0]:offsets[0] + 36 * n]
    if n and not (chars.reshape(n, 36)[:, _DASH_POS] == ord("-")).all():
        return None
    digits = chars.tobytes().replace(b"-", b"")
    if len(digits) != 32 * n:
        return None  # a '-' where a hex digit belongs
    try:
        raw = bytes.fromhex(digits.decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        return None
    if len(raw) != 16 * n:
        return None  # fromhex skips spaces between digit pairs; a UUID has none
    words = np.frombuffer(raw, dtype=">u8")
    words = words.astype(np.uint64).reshape(n, 2)
    hi, lo = words[:, 0], words[:, 1]
    valid = (((hi >> np.uint64(12)) & np.uint64(0xF)) == 1) & ((lo >> np.uint64(62)) == 2)
    if n and not (valid | ~has).all():
        return None  # not version 1, or not the RFC 4122 variant
    out = _parts(hi, lo)
    out.has = has
    return out


def from_ints(uuids: list[int]) -> UuidColumns:
    """The parts of UUIDs given as ints (0: none), as the message library parsed them."""
    u = np.array([(x >> 64, x & 0xFFFFFFFFFFFFFFFF) for x in uuids],
                 dtype=np.uint64).reshape(-1, 2)
    return _parts(u[:, 0], u[:, 1])


def _parts(hi: np.ndarray, lo: np.ndarray) -> UuidColumns:
    """Producer, clock and flags of UUIDs split into their high and low 64 bits."""
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
