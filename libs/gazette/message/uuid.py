"""Message UUIDs: RFC 4122 version 1 UUIDs that carry producer, clock and flags.

Layout (as Gazette's): the 60-bit v1 timestamp (100 ns ticks since 1582-10-15) and a 4-bit
sequence counter form a monotonic `Clock`; the counter is the top 4 bits of the 14-bit
clock sequence and the low 10 bits are `Flags`; the 48-bit node is the `ProducerId`.
Comparing clocks of one producer orders its messages totally.

UUIDs are handled as plain ints on hot paths (`uuid.UUID.int`): taking one apart is a few
shifts, and building one is a few ors.
"""

from __future__ import annotations

import enum
import os
import re
import time
import uuid as _uuid
from typing import NewType

from gazette.errors import ValidationError

#: UUID text as Python's `uuid.UUID` spells it: 8-4-4-4-12 hex digits, optionally without
#: dashes, in braces or after ``urn:uuid:`` -- strictly (int() alone would also take
#: '_', '+' and spaces).
_UUID_TEXT = re.compile(
    r"(?:urn:uuid:)?(\{)?[0-9a-fA-F]{8}(-?)[0-9a-fA-F]{4}\2[0-9a-fA-F]{4}\2[0-9a-fA-F]{4}"
    r"\2[0-9a-fA-F]{12}(?(1)\})")
#: 100 ns intervals between the UUID epoch (1582-10-15) and the Unix epoch.
GREGORIAN_OFFSET = 0x01B21DD213814000

ProducerId = NewType("ProducerId", int)
"""The 48-bit node of a v1 UUID: one producer (a process, or a shard assignment)."""


class Flags(enum.IntFlag):
    """Transaction semantics of a message (the 10 low bits of the clock sequence)."""

    #: Not part of a transaction: committed as soon as it is read.
    OUTSIDE_TXN = 0x0
    #: Begins or continues a transaction, committed by a later ACK_TXN of larger clock.
    CONTINUE_TXN = 0x1
    #: Acknowledges (commits) the producer's CONTINUE_TXN messages of smaller clock, and
    #: rolls back those of larger clock.
    ACK_TXN = 0x2


FLAGS_MASK = 0x3FF


def new_producer_id() -> ProducerId:
    """A random producer id with the multicast bit set, as RFC 4122 asks of ids that are
    not MAC addresses (47 random bits)."""
    node = int.from_bytes(os.urandom(6), "big")
    return ProducerId(node | (1 << 40))


class Clock:
    """A v1 timestamp (60 high bits) and sequence counter (4 low bits): monotonic.

    `tick()` advances it by one for each message; `update(now)` moves it forward to wall
    time (never backward). Update it once per batch, tick once per message.
    """

    __slots__ = ("value",)

    def __init__(self, value: int = 0) -> None:
        self.value = value

    @staticmethod
    def from_unix(seconds: float) -> int:
        """The clock value of a Unix time, counter zero."""
        return (int(seconds * 10_000_000) + GREGORIAN_OFFSET) << 4

    def update(self, now: float | None = None) -> None:
        """Move forward to `now` (Unix seconds; default: the current time, exactly)."""
        if now is None:
            value = (time.time_ns() // 100 + GREGORIAN_OFFSET) << 4
        else:
            value = self.from_unix(now)
        if value > self.value:
            self.value = value

    def tick(self) -> int:
        """Advance by one and return the new value."""
        self.value += 1
        return self.value

    def __repr__(self) -> str:
        return f"Clock({self.value:#x})"


def build(producer: int, clock: int, flags: int) -> int:
    """The UUID (as an int) of a message from `producer` at `clock` with `flags`."""
    timestamp = clock >> 4
    seq = ((clock & 0xF) << 10) | (int(flags) & FLAGS_MASK)  # int(): IntFlag math is slow
    return (
        ((timestamp & 0xFFFFFFFF) << 96)            # time_low
        | (((timestamp >> 32) & 0xFFFF) << 80)      # time_mid
        | ((0x1000 | ((timestamp >> 48) & 0x0FFF)) << 64)  # version 1, time_hi
        | ((0x8000 | seq) << 48)                    # RFC 4122 variant, clock sequence
        | (producer & 0xFFFFFFFFFFFF)
    )


def producer_of(u: int) -> ProducerId:
    return ProducerId(u & 0xFFFFFFFFFFFF)


def clock_of(u: int) -> int:
    timestamp = ((u >> 64) & 0x0FFF) << 48 | ((u >> 80) & 0xFFFF) << 32 | (u >> 96)
    return (timestamp << 4) | ((u >> 58) & 0xF)


def unix_time_of(u: int) -> float:
    """The Unix time (seconds) `u` was made at, as its producer's clock had it."""
    return ((clock_of(u) >> 4) - GREGORIAN_OFFSET) / 10_000_000


def flags_of(u: int) -> Flags:
    return Flags((u >> 48) & FLAGS_MASK)


def is_v1(u: int) -> bool:
    """Whether `u` is an RFC 4122 version 1 UUID (the only kind messages carry)."""
    return (u >> 76) & 0xF == 1 and (u >> 62) & 0x3 == 0b10


def parse(value: object, field: str = "uuid") -> int:
    """A message UUID from its text, `uuid.UUID` or int form; it must be version 1."""
    if isinstance(value, int) and not isinstance(value, bool):
        u = value
        if not 0 <= u < 1 << 128:
            raise ValidationError(field, "is not a 128-bit UUID")
    elif isinstance(value, _uuid.UUID):
        u = value.int
    elif isinstance(value, str):
        if _UUID_TEXT.fullmatch(value) is None:
            raise ValidationError(field, f"{value[:60]!r} is not a UUID "
                                  "(expected 8-4-4-4-12 hex digits)")
        u = int(value.removeprefix("urn:uuid:").strip("{}").replace("-", ""), 16)
    else:
        raise ValidationError(field, f"expected a UUID string, got {type(value).__name__}")
    if not is_v1(u):
        raise ValidationError(
            field, f"{_uuid.UUID(int=u)} is not a version 1 (RFC 4122) UUID: "
            f"version {(u >> 76) & 0xF}")
    return u


def to_str(u: int) -> str:
    return str(_uuid.UUID(int=u))
