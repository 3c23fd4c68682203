"""Message UUIDs: v1 layout, producer / clock / flags round trips, clock monotonicity."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gazette.errors import ValidationError
from gazette.message import uuid as mu
from gazette.message.uuid import Clock, Flags

producers = st.integers(0, (1 << 48) - 1)
clocks = st.integers(0, (1 << 64) - 1)
flags = st.integers(0, 0x3FF)


@given(producers, clocks, flags)
def test_build_and_take_apart(producer: int, clock: int, flag: int) -> None:
    u = mu.build(producer, clock, flag)
    assert mu.producer_of(u) == producer
    assert mu.clock_of(u) == clock
    assert int(mu.flags_of(u)) == flag
    assert mu.is_v1(u)
    std = uuid.UUID(int=u)
    assert std.version == 1 and std.variant == uuid.RFC_4122
    assert std.node == producer
    assert std.time == clock >> 4  # the 60-bit timestamp is the v1 time field
    assert std.clock_seq == ((clock & 0xF) << 10) | flag
    assert mu.parse(str(std)) == u == mu.parse(std) == mu.parse(u)
    assert mu.to_str(u) == str(std)


@given(producers, st.lists(clocks, min_size=2, unique=True), flags)
def test_clock_orders_a_producers_uuids(producer: int, cs: list[int], flag: int) -> None:
    by_clock = sorted(cs)
    built = [mu.build(producer, c, flag) for c in by_clock]
    assert [mu.clock_of(u) for u in built] == by_clock


def test_clock_ticks_and_updates_monotonically() -> None:
    clock = Clock()
    clock.update(1_700_000_000.0)
    start = clock.value
    assert clock.tick() == start + 1 and clock.tick() == start + 2
    clock.update(1_600_000_000.0)  # wall time going back never moves the clock back
    assert clock.value == start + 2
    clock.update(1_700_000_001.0)
    assert clock.value == Clock.from_unix(1_700_000_001.0) > start + 2
    # The timestamp is the v1 epoch's 100 ns ticks.
    u = mu.build(1, Clock.from_unix(0.0), Flags.OUTSIDE_TXN)
    assert uuid.UUID(int=u).time == mu.GREGORIAN_OFFSET


def test_sixteen_ticks_carry_into_the_timestamp() -> None:
    clock = Clock(Clock.from_unix(1.0))
    for _ in range(16):
        clock.tick()
    assert clock.value >> 4 == (Clock.from_unix(1.0) >> 4) + 1
    assert clock.value & 0xF == 0


def test_producer_ids_are_random_multicast_nodes() -> None:
    ids = {mu.new_producer_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(p >> 40 & 1 and p < 1 << 48 for p in ids)


@pytest.mark.parametrize(
    ("value", "phrase"),
    [
        ("e20a7841-5544-450f-b5a2-9acbbb739ecf", "not a version 1"),  # (a v4)
        ("not-a-uuid", "is not a UUID"),
        ("043a44e7-_654-11f1-8400-c903d00201b7", "is not a UUID"),
        (" b8f211fc-e651-11f1-8400-c903d00201b7", "is not a UUID"),
        (3.5, "expected a UUID string"),
        (None, "expected a UUID string"),
        (1 << 129, "not a 128-bit UUID"),
        (-1, "not a 128-bit UUID"),
        (uuid.UUID(int=0), "not a version 1"),
    ],
)
def test_parse_rejects_what_is_not_a_v1_uuid(value: object, phrase: str) -> None:
    with pytest.raises(ValidationError, match=phrase) as err:
        mu.parse(value, "message.uuid")
    assert err.value.field == "message.uuid"


@given(st.text(max_size=50) | st.integers() | st.binary(max_size=20))
def test_parse_fuzz(value: object) -> None:
    try:
        u = mu.parse(value)
    except ValidationError:
        return
    assert mu.is_v1(u)
