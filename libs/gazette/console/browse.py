"""The message browser: one page of a journal's messages from a cursor, framed by the
journal's content type, read-committed (a `Sequencer`) or not, never past the write
head the page began at (so it never waits for appends).

Paging by offset is exact. Uncommitted, a page's next offset is where its last message
ends. Committed, messages are shown in commit order, each when the frame that commits
it is read (a message outside transactions at itself, a transaction's at its ACK): a
`Cursor` is where to read again (the earliest transaction still open, so the next
page's Sequencer sees it whole) and the position up to which what committed was shown
(`after`, and `skip` of the messages committed exactly there). A transaction open for
more than `MAX_PAGE_BYTES / 2` behind the cursor is let go (the page says where it
began; read uncommitted to see it), so every page moves on.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from gazette.client import JournalClient, ReadChunk
from gazette.console.views import escaped, pretty_json, when
from gazette.errors import ValidationError
from gazette.message import (
    Envelope,
    Frame,
    FrameError,
    Framing,
    Sequencer,
    framing_for,
    read_uncommitted,
)
from gazette.message import drain as drain_committed
from gazette.message.uuid import Flags, flags_of, producer_of, to_str, unix_time_of

#: Bytes one page reads at most (it stops at the frame that crosses it); a frame larger
#: than half of it is shown cut, as an error of its framing.
MAX_PAGE_BYTES = 16 << 20
#: Characters of one message shown (the rest is counted, not shown).
MAX_SHOWN = 64 << 10
#: A line of a journal whose content type has no framing is cut into items this long.
RAW_ITEM = 4096


@dataclass(frozen=True)
class Cursor:
    """Where a page starts: `offset` read from; committed, what committed at positions
    before `after` (and the first `skip` messages committed at `after`) was shown."""

    offset: int
    after: int = 0
    skip: int = 0


@dataclass
class Item:
    """A message (or a frame that is none: `error`) as the browser shows it."""

    begin: int
    end: int
    text: str
    json: bool = False
    error: str = ""
    uuid: str = ""
    producer: str = ""
    clock: str = ""
    flags: str = ""


@dataclass
class MessagePage:
    """A page: its `items`, where the next one starts (`next`), whether this one read
    up to the write head (`at_head`), and notes on what it left out."""

    journal: str
    content_type: str
    start: int
    head: int
    committed: bool
    items: list[Item] = field(default_factory=list)
    next: Cursor | None = None
    at_head: bool = False
    notes: list[str] = field(default_factory=list)


class RawLines:
    """The framing of a journal whose content type has none: lines (cut at `RAW_ITEM`
    bytes), each an item without a message."""

    content_type = "application/octet-stream"

    def encode(self, messages: Sequence[Any]) -> bytes:
        raise NotImplementedError("the browser only reads")

    def decode(self, data: bytes, final: bool = False) -> tuple[list[Frame], int]:
        frames, pos = [], 0
        while pos < len(data):
            cut = data.find(b"\n", pos, pos + RAW_ITEM)
            if cut >= 0:
                end = cut + 1
            elif len(data) - pos >= RAW_ITEM or final:
                end = min(len(data), pos + RAW_ITEM)
            else:
                break
            frames.append(Frame(pos, end))
            pos = end
        return frames, pos


class _Unfinished:
    """`framing`, except that a read cut short (`cut`) does not decode its incomplete
    last frame as final: it is the next page's first."""

    def __init__(self, framing: Framing) -> None:
        self.inner, self.cut = framing, False
        self.content_type = framing.content_type
        #: The framing's fast path, if it has one (`read_uncommitted` tries it first).
        self.decode_envelopes: Any = getattr(framing, "decode_envelopes", None)

    def encode(self, messages: Sequence[Any]) -> bytes:
        return self.inner.encode(messages)

    def decode(self, data: bytes, final: bool = False) -> tuple[list[Frame], int]:
        return self.inner.decode(data, final and not self.cut)


def framing_of(content_type: str) -> Framing:
    """The framing the journal's content type names (a frame's size bounded by the
    page's), else `RawLines`."""
    if not content_type:
        return RawLines()
    try:
        return framing_for(content_type, max_frame=MAX_PAGE_BYTES // 2)
    except ValidationError:
        return RawLines()


def item_of(raw: bytes, begin: int, end: int, uuid: int = 0, error: str = "") -> Item:
    """What the page shows of the frame `raw` at [begin, end)."""
    shown = raw[:MAX_SHOWN]
    text = None if error or len(raw) > MAX_SHOWN else pretty_json(raw)
    item = Item(begin, end, text if text is not None else escaped(shown), text is not None,
                error)
    if len(raw) > MAX_SHOWN:
        item.text += f"\n... ({len(raw) - MAX_SHOWN} bytes more)"
    if uuid:
        flags = flags_of(uuid)
        item.uuid, item.producer = to_str(uuid), f"{producer_of(uuid):012x}"
        item.clock = when(unix_time_of(uuid))
        item.flags = ("ACK" if flags & Flags.ACK_TXN else "transaction"
                      if flags & Flags.CONTINUE_TXN else "outside transactions")
    return item


class _Read:
    """One page's read: the journal's bytes from the first chunk on, contiguous and up
    to `MAX_PAGE_BYTES`, kept for showing frames and serving the Sequencer's replays."""

    def __init__(self, client: JournalClient, journal: str, start: int, head: int,
                 framing: Framing) -> None:
        self.client, self.journal, self.start, self.head = client, journal, start, head
        self.framing = _Unfinished(framing)
        self.buf = bytearray()
        self.base = start
        self.stopped = ""  # why the read stopped before the head
        self.errors: list[FrameError] = []

    def raw(self, begin: int, end: int) -> bytes:
        return bytes(self.buf[begin - self.base:end - self.base])

    async def batches(self) -> AsyncGenerator[list[Envelope | FrameError], None]:
        """Frames in order: envelopes and, where they are, frames that are no message."""
        reads = self.client.read(self.journal, self.start, end_offset=self.head)
        async with contextlib.aclosing(reads):
            first = await anext(reads, None)
            if first is None:
                return
            self.base = first.offset

            async def contiguous() -> AsyncIterator[bytes]:
                chunk: ReadChunk | None = first
                while chunk is not None:
                    if chunk.offset != self.base + len(self.buf):
                        self.framing.cut = True
                        self.stopped = (f"bytes from offset {self.base + len(self.buf)} "
                                        f"to {chunk.offset} are missing (removed)")
                        return
                    self.buf += chunk.content
                    yield bytes(chunk.content)
                    if len(self.buf) >= MAX_PAGE_BYTES and chunk.end < self.head:
                        self.framing.cut = True
                        self.stopped = (f"a page reads {MAX_PAGE_BYTES >> 20} MiB at most")
                        return
                    chunk = await anext(reads, None)

            async for batch in read_uncommitted(self.journal, contiguous(), self.framing,
                                                self.base, self.errors.append):
                yield _merged(batch, self.errors)
            if self.errors:
                yield _merged([], self.errors)

    async def replay(self, journal: str, begin: int, end: int
                     ) -> AsyncIterator[list[Envelope]]:
        """What the Sequencer asks to read again: from the bytes read."""
        async def one() -> AsyncIterator[bytes]:
            yield self.raw(begin, end)

        async for batch in read_uncommitted(journal, one(), self.framing.inner, begin,
                                            lambda err: None):
            yield batch


def _merged(batch: list[Envelope], errors: list[FrameError]
            ) -> list[Envelope | FrameError]:
    """`batch` with the frame errors reported while it was decoded, in offset order."""
    if not errors:
        return list(batch)
    out: list[Envelope | FrameError] = [*batch, *errors]
    errors.clear()
    out.sort(key=lambda e: e.begin)
    return out


async def read_page(client: JournalClient, journal: str, content_type: str, head: int,
                    cursor: Cursor, limit: int, committed: bool) -> MessagePage:
    """Up to `limit` messages of `journal` from `cursor`, no further than `head`."""
    page = MessagePage(journal, content_type or "none", cursor.offset, head, committed)
    framing = framing_of(content_type)
    if isinstance(framing, RawLines):
        if content_type:
            page.notes.append(f"no framing for content type {content_type!r}: shown as "
                              "lines of bytes")
        committed = page.committed = False
    read = _Read(client, journal, cursor.offset, head, framing)
    if cursor.offset >= head:
        page.at_head, page.next = True, cursor
        return page
    if committed:
        await _committed(page, read, cursor, limit)
    else:
        await _uncommitted(page, read, limit)
    if read.base > cursor.offset:
        page.notes.insert(0, f"bytes {cursor.offset} to {read.base} are no longer in the "
                          "journal (removed by retention); shown from where it resumes")
    if read.stopped:
        page.notes.append(f"this page stops early: {read.stopped}")
    return page


def _show(read: _Read, frame: Envelope | FrameError) -> Item:
    raw = read.raw(frame.begin, frame.end)
    if isinstance(frame, FrameError):
        return item_of(raw, frame.begin, frame.end, error=frame.reason)
    return item_of(raw, frame.begin, frame.end, frame.uuid)


async def _uncommitted(page: MessagePage, read: _Read, limit: int) -> None:
    end, full = read.start, False
    async with contextlib.aclosing(read.batches()) as batches:  # (its read ends here)
        async for batch in batches:
            for frame in batch:
                page.items.append(_show(read, frame))
                end = frame.end
                if len(page.items) >= limit:
                    full = True
                    break
            if full:
                break
    if not page.items and read.stopped:
        end = read.base + len(read.buf)
    page.at_head = not full and not read.stopped
    page.next = Cursor(max(end, read.base) if page.items or read.stopped else page.head)


async def _committed(page: MessagePage, read: _Read, cursor: Cursor, limit: int) -> None:
    sequencer = Sequencer()
    position, at_position, full, cut = -1, 0, False, False
    last: list[Envelope | FrameError] = []  # what committed at `position`
    async with contextlib.aclosing(read.batches()) as batches:  # (its read ends here)
        async for batch in batches:
            for frame in batch:
                if isinstance(frame, FrameError):
                    emitted: list[Envelope | FrameError] = [frame]
                else:
                    sequencer.queue(frame)
                    emitted = list(await drain_committed(sequencer, read.replay))
                position, at_position, last = frame.end, 0, []
                for env in emitted:
                    last.append(env)
                    at_position += 1
                    if position < cursor.after or (position == cursor.after
                                                   and at_position <= cursor.skip):
                        continue  # shown on an earlier page
                    if isinstance(env, Envelope) and env.uuid and \
                            flags_of(env.uuid) & Flags.ACK_TXN:
                        continue  # an ACK commits; it is no message of its own
                    page.items.append(_show(read, env))
                    if len(page.items) >= limit:
                        full = True
                        break
                if full:
                    cut = at_position < len(emitted)
                    break
            if full:
                break
    page.at_head = not full and not read.stopped
    if position < 0:  # no frame: nothing moves, unless bytes were read and cut short
        offset = read.base + len(read.buf) if read.stopped else cursor.offset
        page.next = Cursor(max(offset, cursor.offset), cursor.after, cursor.skip)
        return
    # Read again from the earliest transaction still open (or the first message
    # committed at `position`, if the page filled among them), unless it began too far
    # back to read again within a page.
    after = max(position, cursor.after)
    floor = after - MAX_PAGE_BYTES // 2
    open_at = [s.begin for s in sequencer.producer_states() if s.begin >= 0]
    cut_short = [e.begin for e in last] if cut else []
    restart = min([b for b in (*open_at, *cut_short) if b >= floor], default=position)
    for begin in sorted(b for b in open_at if b < floor):
        page.notes.append(f"a transaction open since offset {begin} is not followed "
                          "(too far back): read uncommitted from there to see it")
    page.next = Cursor(min(restart, position), after,
                       at_position if position == after else cursor.skip)
