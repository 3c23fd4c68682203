"""Append input: records cut at their boundaries, batched as they stream in."""

from __future__ import annotations

import asyncio
import io
import os
import struct
import time

import pytest

from gazette.gazctl.framing import (
    READ_SIZE,
    FramingError,
    InputPump,
    batches,
    fixed_boundary,
    lines_boundary,
)
from gazette.message.framing.fixed import FIXED_FRAME_MAGIC


def frame(payload: bytes) -> bytes:
    return FIXED_FRAME_MAGIC + struct.pack("<I", len(payload)) + payload


def test_lines_boundary() -> None:
    assert lines_boundary(b"", 10) == 0
    assert lines_boundary(b"partial", 10) == 0
    assert lines_boundary(b"a\nb\npart", 100) == 4
    assert lines_boundary(b"a\nb\nc\n", 4) == 4  # as many lines as fit the limit
    assert lines_boundary(b"a\nb\nc\n", 0) == 2  # limit 0: the first line
    assert lines_boundary(b"a-long-line\nb\n", 5) == 12  # a long line goes alone, whole


def test_fixed_boundary() -> None:
    one, two = frame(b"hello"), frame(b"world!")
    assert fixed_boundary(b"", 100) == 0
    assert fixed_boundary(one[:7], 100) == 0  # header incomplete
    assert fixed_boundary(one[:-1], 100) == 0  # payload incomplete
    assert fixed_boundary(one + two + two[:3], 100) == len(one + two)
    assert fixed_boundary(one + two, len(one) + 1) == len(one)
    assert fixed_boundary(one + two, 0) == len(one)
    assert fixed_boundary(frame(b"x" * 50) + one, 10) == 58  # a big frame alone
    # Whole frames before a bad header go first; the bad header is an error.
    assert fixed_boundary(one + b"garbage!", 100, at=100) == len(one)
    with pytest.raises(FramingError, match=r"input offset 113: not a fixed frame header"):
        fixed_boundary(b"garbage!", 100, at=113)


async def _pump_from(chunks: list[tuple[float, bytes]]) -> tuple[InputPump, asyncio.Task[None]]:
    """A pump reading a pipe written with (delay, bytes) steps, then closed."""
    r, w = os.pipe()

    async def writer() -> None:
        try:
            for delay, data in chunks:
                await asyncio.sleep(delay)
                os.write(w, data)
        finally:
            os.close(w)

    task = asyncio.create_task(writer())
    pump = InputPump(lambda n: os.read(r, n))
    return pump, task


async def _collect(pump: InputPump, **kwargs: object) -> list[tuple[float, bytes]]:
    start = time.monotonic()
    return [(time.monotonic() - start, b) async for b in batches(pump, **kwargs)]  # type: ignore[arg-type]


async def test_lines_are_batched_never_split() -> None:
    pump, writer = await _pump_from([(0, b"one\ntw"), (0.01, b"o\nthree\n"), (0.4, b"four\n"),
                                     (0.01, b"fi"), (0.01, b"ve")])
    got = await _collect(pump, boundary=lines_boundary, linger=0.15)
    await writer
    contents = [b for _, b in got]
    # Lines that came within the linger went together; the last line needs no newline
    # and went with the lines before it at the end of the input.
    assert contents == [b"one\ntwo\nthree\n", b"four\nfive"]
    # The first batch went ~linger after its first line came, not at the end of input.
    assert 0.1 < got[0][0] < 0.35


async def test_large_input_goes_in_limited_batches() -> None:
    lines = b"".join(b"%09d\n" % i for i in range(1000))  # 10 bytes a line
    pump, writer = await _pump_from([(0, lines)])
    got = [b for _, b in await _collect(pump, boundary=lines_boundary, limit=1000)]
    await writer
    assert b"".join(got) == lines
    assert all(len(b) <= 1000 and b.endswith(b"\n") for b in got)


async def test_fixed_frames_and_a_truncated_end() -> None:
    frames = [frame(b"a" * n) for n in (1, 10, 100)]
    data = b"".join(frames)
    pump, writer = await _pump_from([(0, data[:20]), (0.02, data[20:])])
    got = [b for _, b in await _collect(pump, boundary=fixed_boundary, partial_ok=False)]
    await writer
    assert b"".join(got) == data

    pump, writer = await _pump_from([(0, frames[0] + frames[1][:5])])
    with pytest.raises(FramingError, match="input offset 9: the input ended inside a record"):
        await _collect(pump, boundary=fixed_boundary, partial_ok=False)
    await writer


async def test_input_errors_surface() -> None:
    def fail(n: int) -> bytes:
        raise OSError(5, "Input/output error")

    pump = InputPump(fail)
    with pytest.raises(OSError, match="Input/output error"):
        await _collect(pump, boundary=lines_boundary)


async def test_chunks_stream_everything() -> None:
    pump, writer = await _pump_from([(0, b"abc"), (0.01, b"def"), (0.01, b"")])
    got = b"".join([c async for c in pump.chunks()])
    await writer
    assert got == b"abcdef"


async def test_the_reader_waits_above_the_high_water_mark() -> None:
    reads = 0

    def endless(n: int) -> bytes:
        nonlocal reads
        reads += 1
        return b"x" * n

    pump = InputPump(endless, high_water=1 << 16)
    await asyncio.sleep(0.1)
    # Held back above the mark (2 reads of 64 KiB), not reading for ever.
    assert len(pump.buffer) <= 2 << 16 and reads <= 2
    pump.take(len(pump.buffer))
    await asyncio.sleep(0.05)
    assert reads >= 2


async def test_a_record_over_the_high_water_mark_is_read_whole() -> None:
    # The reader holds back at 64 KiB, but a line of 300 KiB must be read whole first.
    big = b"x" * (300 << 10) + b"\n"
    data = b"a\n" + big + b"b\n" + b"y" * (200 << 10)  # the last line has no newline
    pump = InputPump(io.BytesIO(data).read, high_water=1 << 16)
    async with asyncio.timeout(10):
        got = [b for _, b in await _collect(pump, boundary=lines_boundary, limit=1 << 16)]
    assert b"".join(got) == data
    assert got[0] == b"a\n" and big in got  # the long line went alone, in one piece

    frames = frame(b"f" * (300 << 10)) + frame(b"g")
    pump = InputPump(io.BytesIO(frames).read, high_water=1 << 16)
    async with asyncio.timeout(10):
        got = [b for _, b in await _collect(pump, boundary=fixed_boundary, limit=1 << 16,
                                            partial_ok=False)]
    assert got == [frame(b"f" * (300 << 10)), frame(b"g")]


async def test_a_record_over_the_limit_is_an_error_not_unbounded_buffering() -> None:
    reads = 0

    def endless(n: int) -> bytes:  # a line that never ends
        nonlocal reads
        reads += 1
        return b"ok\n" if reads == 1 else b"x" * n

    pump = InputPump(endless, high_water=1 << 16)
    got: list[bytes] = []
    with pytest.raises(FramingError) as err:
        async with asyncio.timeout(10):
            async for batch in batches(pump, lines_boundary, max_record=1 << 20):
                got.append(batch)
    assert str(err.value) == ("input offset 3: a record is longer than the limit of "
                              "1048576 bytes (1.0 MiB)")
    assert got == [b"ok\n"]  # the whole records before it were batched
    # It stopped reading soon after the limit: at most a read more than it.
    assert (1 << 20) < len(pump.buffer) <= (1 << 20) + READ_SIZE
    assert reads <= 2 + (1 << 20) // READ_SIZE


async def test_a_whole_line_over_the_limit_and_a_last_line_over_it_are_errors() -> None:
    for data in (b"x" * 100 + b"\nok\n", b"ok\n" + b"x" * 100):
        pump = InputPump(io.BytesIO(data).read)
        with pytest.raises(FramingError, match=r"longer than the limit of 64 bytes"):
            await _collect(pump, boundary=lines_boundary, max_record=64)
    pump = InputPump(io.BytesIO(frame(b"x" * 100)).read)
    with pytest.raises(FramingError, match=r"input offset 0: a record is longer than"):
        await _collect(pump, boundary=fixed_boundary, max_record=64, partial_ok=False)
    # At the limit is fine, and batches are no larger than the limit either.
    data = b"x" * 63 + b"\n" + b"a\n" * 40
    pump = InputPump(io.BytesIO(data).read)
    got = [b for _, b in await _collect(pump, boundary=lines_boundary, max_record=64)]
    assert b"".join(got) == data and max(len(b) for b in got) == 64


def test_lines_boundary_resumes_its_search() -> None:
    # `start`: the first bytes are known to hold no newline (a long line read in parts).
    assert lines_boundary(b"xxxx\nyy\n", 0, 3) == 5
    assert lines_boundary(b"xxxxxxx", 0, 4) == 0
