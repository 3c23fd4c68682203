"""Input for ``journals append``: stdin read in a thread as it arrives (`InputPump`), cut
into batches of whole records (`batches`) so that no record is ever split across
appends. A record longer than the pump's high-water mark is still read whole; one
longer than `MAX_RECORD` (or the limit given) is an error rather than unbounded memory.

Records are lines (``lines``: a final line without its newline is a record too) or fixed
frames (``fixed``: Gazette's 8-byte header, the magic word ``66 33 93 36`` and a
little-endian uint32 payload length, then the payload).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
import time
from collections.abc import AsyncIterator, Callable

from gazette.errors import GazetteError
from gazette.gazctl.output import human_bytes
from gazette.message.framing.fixed import FIXED_FRAME_HEADER_LENGTH, FIXED_FRAME_MAGIC

#: Largest batch of whole records in one append (a larger record is appended alone).
BATCH_BYTES = 1 << 20
#: How long a complete record may wait for more input before it is appended.
LINGER = 0.1
#: Bytes read from the input at a time, and the most held before the reader waits
#: (unless a record longer than that is still being read).
READ_SIZE = 1 << 16
HIGH_WATER = 4 << 20
#: Longest record read whole: the broker's default --broker.max-append-size, since a
#: longer one could not be appended anyway.
MAX_RECORD = 256 << 20

_HEADER = struct.Struct("<4sI")


class FramingError(GazetteError):
    """Input that is not records of the chosen framing."""


class RecordTooLong(FramingError):
    """A record longer than the limit of what is read whole."""


def lines_boundary(buf: bytes | bytearray, limit: int, start: int = 0) -> int:
    """Where to cut `buf` after whole lines: the most lines within `limit` bytes, or the
    first line alone if it is longer; 0 if no line is complete yet. `start`: the first
    bytes are known to hold no newline (so a long line read in parts is not searched
    again from its beginning after every read)."""
    cut = buf.rfind(b"\n", 0, limit) + 1
    if cut:
        return cut
    return buf.find(b"\n", start) + 1


def fixed_boundary(buf: bytes | bytearray, limit: int, start: int = 0, *, at: int = 0) -> int:
    """Where to cut `buf` after whole fixed frames: the most frames within `limit` bytes,
    or the first frame alone if it is longer; 0 if no frame is complete yet. `at` is
    the input offset of ``buf[0]`` (for errors); `start` is unused (a header says where
    its frame ends). FramingError if the first header is not one (a bad header after
    whole frames ends the batch before it)."""
    pos = 0
    while pos + FIXED_FRAME_HEADER_LENGTH <= len(buf):
        magic, length = _HEADER.unpack_from(buf, pos)
        if magic != FIXED_FRAME_MAGIC:
            if pos:
                break  # the frames before it go first; the error is raised after them
            raise FramingError(
                f"input offset {at + pos}: not a fixed frame header (expected the magic "
                f"word {FIXED_FRAME_MAGIC.hex()}, got {bytes(magic).hex()})")
        end = pos + FIXED_FRAME_HEADER_LENGTH + length
        if end > len(buf) or (pos and end > limit):
            break
        pos = end
    return pos


#: ``boundary(buf, limit, start)``: see `lines_boundary`.
Boundary = Callable[[bytearray, int, int], int]


class InputPump:
    """Reads a blocking input (stdin, a file) in a daemon thread and collects what
    arrives in `buffer`, waking `changed`; the thread waits while more than `high_water`
    bytes are held (so a fast producer is slowed down to the journal's pace), unless
    `hold` lets it read on to finish a long record. The thread is a daemon: an input
    that never ends cannot hold up gazctl's exit."""

    def __init__(self, read: Callable[[int], bytes], high_water: int = HIGH_WATER) -> None:
        self._read = read
        self.high_water = high_water
        self.buffer = bytearray()
        self.eof = False
        self.error: BaseException | None = None
        #: Total bytes taken out of `buffer` so far (the input offset of buffer[0]).
        self.taken = 0
        self.changed = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        #: Bytes read but not yet taken (counted by the thread as it reads, so that it
        #: stops in time even while the loop has not seen them yet).
        self._held = 0
        #: The most held before the reader waits: `high_water`, or more (`hold`).
        self._allowed = high_water
        self._room = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="gazctl-stdin", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                data = self._read(READ_SIZE)
            except BaseException as exc:  # noqa: BLE001 - handed to the loop
                self._post(None, exc)
                return
            with self._room:
                self._held += len(data)
            if not self._post(data, None) or not data:
                return
            with self._room:
                self._room.wait_for(lambda: self._held <= self._allowed)

    def _post(self, data: bytes | None, error: BaseException | None) -> bool:
        try:
            self._loop.call_soon_threadsafe(self._feed, data, error)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            return False
        return True

    def _feed(self, data: bytes | None, error: BaseException | None) -> None:
        if error is not None:
            self.error, self.eof = error, True
        elif data:
            self.buffer += data
        else:
            self.eof = True
        self.changed.set()

    def hold(self, n: int) -> None:
        """Let the reader go on until more than `n` bytes are held (if that is above
        `high_water`), until the next `take`: a record longer than the high-water mark
        must be read whole before any of it can go."""
        with self._room:
            if n > self._allowed:
                self._allowed = n
                self._room.notify()

    def take(self, n: int) -> bytes:
        """The first `n` bytes of the buffer, removed."""
        out = bytes(self.buffer[:n])
        del self.buffer[:n]
        self.taken += n
        with self._room:
            self._held -= n
            self._allowed = self.high_water
            self._room.notify()
        return out

    def check(self) -> None:
        """Raise the input's read error, if it had one."""
        if self.error is not None:
            raise self.error

    async def wait(self, timeout: float | None = None) -> None:
        """Until more input (or its end) arrives, or `timeout` seconds pass."""
        self.changed.clear()
        if self.eof:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.changed.wait()

    async def chunks(self) -> AsyncIterator[bytes]:
        """Everything, as it arrives (for one streamed append)."""
        while True:
            if self.buffer:
                yield self.take(len(self.buffer))
                continue
            self.check()
            if self.eof:
                return
            await self.wait()


def _too_long(at: int, max_record: int) -> RecordTooLong:
    size = f" ({human_bytes(max_record)})" if max_record >= 1024 else ""
    return RecordTooLong(f"input offset {at}: a record is longer than the limit of "
                         f"{max_record} bytes{size}")


async def batches(pump: InputPump, boundary: Boundary, *, limit: int = BATCH_BYTES,
                  linger: float = LINGER, partial_ok: bool = True,
                  max_record: int = MAX_RECORD) -> AsyncIterator[bytes]:
    """Batches of whole records from `pump`: a batch goes once `limit` bytes are held,
    once its first record has waited `linger` seconds for more, or at the end of the
    input; records that came while a batch was being appended go right after it. What
    is left at the end without a boundary is a last record if `partial_ok`, else a
    FramingError. A record longer than `max_record` is a `RecordTooLong` (after the
    batches before it), and no batch is longer than that either."""
    limit = min(limit, max_record)
    deadline: float | None = None
    scanned = 0  # bytes at the front of the buffer known to hold no record's end
    while True:
        # The first record only (limit 0), resumed where the last look stopped: cheap
        # to ask after every read, even while a long record arrives.
        first = boundary(pump.buffer, 0, scanned) if pump.buffer else 0
        if first > max_record:
            raise _too_long(pump.taken, max_record)
        if first:
            now = time.monotonic()
            deadline = now + linger if deadline is None else deadline
            if len(pump.buffer) >= limit or now >= deadline or pump.eof:
                cut = boundary(pump.buffer, limit, 0)
                if pump.eof and partial_ok and len(pump.buffer) <= limit:
                    cut = len(pump.buffer)  # the last line need not end in a newline
                yield pump.take(cut)
                scanned = 0
                # What is complete already waited while that batch was appended.
                deadline = time.monotonic()
                continue
        else:
            deadline = None
            scanned = len(pump.buffer)
            if scanned > max_record:
                raise _too_long(pump.taken, max_record)
            if scanned >= pump.high_water:
                pump.hold(max_record)  # a long record: read on past the high-water mark
        if pump.eof:
            pump.check()
            if pump.buffer:
                if not partial_ok:
                    raise FramingError(f"input offset {pump.taken}: the input ended inside "
                                       f"a record ({len(pump.buffer)} bytes left over)")
                yield pump.take(len(pump.buffer))
            return
        await pump.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
