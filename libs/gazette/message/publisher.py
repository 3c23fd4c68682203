"""The Publisher: maps, sequences, encodes and appends messages to journals.

Each published message is mapped to a journal (see `gazette.message.mapping`), given a
UUID of the publisher's producer id, its next clock tick and the transaction flags, encoded
with the journal's framing and handed to an `AppendClient`, which queues it at once. The
Publisher never awaits: it returns the client's future, which resolves when the append
commits. Await it, gather many, or ignore it ("fire and forget").

Two modes, as in Gazette:

- `Publisher.publish_committed`: the message is outside any transaction
  (``OUTSIDE_TXN``), readable by read-committed readers as soon as it commits. Use it in
  pure producers: API servers, log shippers.
- `Publisher.publish_uncommitted`: the message begins or continues the open transaction
  (``CONTINUE_TXN``); read-committed readers hold it back until an ACK (``ACK_TXN``) of a
  larger clock from the same producer follows it in its journal. `build_ack_intents`
  returns those ACKs, one per journal written since the last call. Consumers use this:
  the consumer framework builds the intents, commits them with its checkpoint, then
  appends them, which makes the transaction's output exactly-once.

Why clocks stay ordered: one Clock ticks once per message, and `AppendClient.append`
queues synchronously, so within each journal, bytes are in tick order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from gazette.errors import ValidationError
from gazette.message.base import Framing, Message, framing_for
from gazette.message.mapping import MappingFunc, Partition
from gazette.message.uuid import Clock, Flags, ProducerId, build, new_producer_id

# Plain ints: `build` on an IntFlag member goes through enum arithmetic (~4x slower).
_OUTSIDE_TXN = int(Flags.OUTSIDE_TXN)
_CONTINUE_TXN = int(Flags.CONTINUE_TXN)
_ACK_TXN = int(Flags.ACK_TXN)


class AppendClient(Protocol):
    """Appends bytes to journals; the journal client implements it (`MemoryJournals` is
    an in-memory one).

    `append` must *queue synchronously*: the order of calls is the order of the bytes in
    each journal (which keeps UUID clocks ordered per journal). Appends to one journal
    commit in call order; the client may coalesce many small appends into one write. It
    returns a future (of the running loop) that resolves when the append has committed,
    with a result of the client's choosing (a commit record such as journal and offsets),
    or fails with the reason it could not be appended. Each `data` is whole frames, and
    must be appended contiguously (never interleaved with another append's bytes).
    """

    def append(self, journal: str, data: bytes) -> asyncio.Future[Any]: ...


@dataclass(frozen=True, slots=True)
class AckIntent:
    """An encoded ACK message and its journal: appending `data` to `journal` commits the
    producer's pending messages there. Appending it again is harmless (readers drop
    a repeated ACK), so intents are retried until they commit."""

    journal: str
    data: bytes


class Publisher:
    """Publishes messages through `client` as producer `producer` (random by default).

    Without a `clock`, the Publisher keeps its own and moves it to the wall time on each
    publish. With one, it only ticks it: the caller updates it (say once per batch or
    transaction), saving a time call per message. `framings` resolves a journal's
    content type to its framing (default: the registry, `framing_for`); one framing
    instance per content type is kept.

    Not thread-safe: use it from its event loop's thread. A message's UUID is set before
    it is encoded; it is not yet set when `validate()` or the mapping is called.
    """

    __slots__ = (
        "_client",
        "_clock",
        "_framing_for",
        "_framings",
        "_own_clock",
        "_producer",
        "_txn",
    )

    def __init__(
        self,
        client: AppendClient,
        clock: Clock | None = None,
        producer: int | None = None,
        *,
        framings: Callable[[str], Framing] = framing_for,
    ) -> None:
        if producer is None:
            producer = new_producer_id()
        elif isinstance(producer, bool) or not isinstance(producer, int) or not (
                0 <= producer < 1 << 48):
            raise ValidationError("producer", f"expected a 48-bit producer id, got {producer!r}")
        self._client = client
        self._own_clock = clock is None
        self._clock = Clock() if clock is None else clock
        self._producer = ProducerId(producer)
        self._framing_for = framings
        self._framings: dict[str, Framing] = {}
        # The open transaction: journal -> (its framing, the ACK message to send it).
        self._txn: dict[str, tuple[Framing, Message]] = {}

    @property
    def producer(self) -> ProducerId:
        return self._producer

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def transaction_journals(self) -> tuple[str, ...]:
        """Journals written by `publish_uncommitted` since the last `build_ack_intents`."""
        return tuple(self._txn)

    def publish_committed(self, mapping: MappingFunc, msg: Message) -> asyncio.Future[Any]:
        """Map, sequence (``OUTSIDE_TXN``), encode and append `msg`; returns the client's
        future of the append's commit.

        Raises, appending nothing, what `msg.validate()` (if it has one) raises, what the
        mapping raises (such as `NoPartitions`), a ValidationError if the journal's
        content type has no framing, and what encoding raises.
        """
        validate = getattr(msg, "validate", None)
        if validate is not None:
            validate()
        part = mapping(msg)
        framing = self._framings.get(part.content_type)
        if framing is None:
            framing = self._resolve(part)
        clock = self._clock
        if self._own_clock:
            clock.update()
        msg.set_uuid(build(self._producer, clock.tick(), _OUTSIDE_TXN))
        return self._client.append(part.journal, framing.encode((msg,)))

    def publish_uncommitted(self, mapping: MappingFunc, msg: Message) -> asyncio.Future[Any]:
        """As `publish_committed`, but `msg` joins the open transaction
        (``CONTINUE_TXN``): read-committed readers see it only after the ACK that the
        next `build_ack_intents` makes for its journal has been appended."""
        validate = getattr(msg, "validate", None)
        if validate is not None:
            validate()
        part = mapping(msg)
        journal = part.journal
        framing = self._framings.get(part.content_type)
        if framing is None:
            framing = self._resolve(part)
        entry = self._txn.get(journal)
        if entry is None:
            entry = (framing, msg.new_acknowledgement(journal))
        clock = self._clock
        if self._own_clock:
            clock.update()
        msg.set_uuid(build(self._producer, clock.tick(), _CONTINUE_TXN))
        data = framing.encode((msg,))
        # The ACK message is made, and the journal joins the transaction, before the
        # append: a message queued outside the transaction's ACKs would be committed by
        # a later transaction's ACK instead, whereas should the append itself raise, an
        # ACK of a journal with nothing pending is harmless.
        self._txn[journal] = entry
        return self._client.append(journal, data)

    def build_ack_intents(self) -> list[AckIntent]:
        """The ACKs of the open transaction, one per journal it wrote (in order of first
        write), each with a fresh clock tick, larger than every message it commits; and
        a new transaction begins.

        The caller must store the intents durably (a consumer checkpoint) *before*
        appending them, and append all of them, retrying after faults: that is what
        makes the transaction atomic across journals. Consumer applications never call
        this: the consumer framework does, as part of its transactions.

        A message type that cannot carry a UUID (``get_uuid()`` stays None) is delivered
        at least once, without waiting for an ACK, so its journals get no intent.
        """
        txn, self._txn = self._txn, {}
        if not txn:
            return []
        clock = self._clock
        if self._own_clock:
            clock.update()
        intents = []
        for journal, (framing, ack) in txn.items():
            ack.set_uuid(build(self._producer, clock.tick(), _ACK_TXN))
            if ack.get_uuid() is None:
                continue
            intents.append(AckIntent(journal, framing.encode((ack,))))
        return intents

    def publish_acks(self) -> list[asyncio.Future[Any]]:
        """Build the ACK intents and append them at once; the futures of their appends.

        For publishers outside consumers, and weaker than a consumer's transactions:
        nothing stores the intents first, so a crash (or an append that keeps failing)
        between the ACKs of different journals commits the transaction in some journals
        but not others, and a crash before any ACK loses the transaction altogether (a
        new Publisher has a new producer id, whose ACKs never commit the old one's
        messages). Retry a failed ACK by appending its intent again.
        """
        append = self._client.append
        return [append(intent.journal, intent.data) for intent in self.build_ack_intents()]

    def _resolve(self, part: Partition) -> Framing:
        if not part.content_type:
            raise ValidationError(
                "content-type", f"journal {part.journal!r} has no content-type label")
        framing = self._framing_for(part.content_type)
        self._framings[part.content_type] = framing
        return framing


@dataclass(frozen=True, slots=True)
class MemoryCommit:
    """Where `MemoryJournals` wrote an append: bytes [begin, end) of `journal`."""

    journal: str
    begin: int
    end: int


class MemoryJournals:
    """Journals in memory: an `AppendClient` for tests and examples, and a place to read
    back what was published.

    An append is written and its future resolved at once (with a `MemoryCommit`) unless
    its journal is held (`hold`): then it waits, in order, for `release` (written,
    resolved) or `fail` (dropped, the future fails). Calls need a running event loop.
    """

    __slots__ = ("_data", "_held", "_hold_all", "_queued", "_waiters")

    def __init__(self) -> None:
        self._data: dict[str, bytearray] = {}
        self._hold_all = False
        self._held: set[str] = set()
        self._queued: dict[str, list[tuple[bytes, asyncio.Future[MemoryCommit]]]] = {}
        self._waiters: dict[str, list[tuple[int, asyncio.Future[int]]]] = {}

    def append(self, journal: str, data: bytes) -> asyncio.Future[MemoryCommit]:
        fut: asyncio.Future[MemoryCommit] = asyncio.get_running_loop().create_future()
        queued = self._queued.get(journal)
        if queued is not None:
            queued.append((data, fut))
        elif self._hold_all or journal in self._held:
            self._queued[journal] = [(data, fut)]
        else:
            fut.set_result(self._write(journal, data))
        return fut

    # --- holding appends (tests of slow and failing appends) --------------------------

    def hold(self, journal: str | None = None) -> None:
        """Queue appends to `journal` (None: to every journal) from now on."""
        if journal is None:
            self._hold_all = True
        else:
            self._held.add(journal)

    def release(self, journal: str | None = None) -> None:
        """End the hold of `journal` (None: all holds) and commit its queued appends."""
        if journal is None:
            self._hold_all = False
            self._held.clear()
            journals = list(self._queued)
        else:
            self._held.discard(journal)
            journals = [journal] if not self._hold_all else []
        for name in journals:
            for data, fut in self._queued.pop(name, ()):
                commit = self._write(name, data)
                if not fut.done():
                    fut.set_result(commit)

    def fail(self, exc: BaseException, journal: str | None = None) -> None:
        """Drop the queued appends of `journal` (None: of all journals), failing their
        futures with `exc`. Holds stay in place."""
        journals = list(self._queued) if journal is None else [journal]
        for name in journals:
            for _, fut in self._queued.pop(name, ()):
                if not fut.done():
                    fut.set_exception(exc)

    def pending(self, journal: str) -> int:
        """How many appends to `journal` are queued."""
        return len(self._queued.get(journal, ()))

    # --- reading back -----------------------------------------------------------------

    @property
    def journals(self) -> list[str]:
        """Journals written to, sorted."""
        return sorted(self._data)

    def head(self, journal: str) -> int:
        """The offset the next append to `journal` is written at."""
        data = self._data.get(journal)
        return 0 if data is None else len(data)

    def read(self, journal: str, begin: int = 0, end: int | None = None) -> bytes:
        """Bytes [begin, end) of `journal` (to its head by default)."""
        return bytes(self._data.get(journal, b"")[begin:end])

    async def wait_beyond(self, journal: str, offset: int) -> int:
        """Wait until `journal`'s head is beyond `offset`; returns the head."""
        head = self.head(journal)
        if head > offset:
            return head
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(journal, []).append((offset, fut))
        return await fut

    def _write(self, journal: str, data: bytes) -> MemoryCommit:
        buf = self._data.get(journal)
        if buf is None:
            buf = self._data[journal] = bytearray()
        begin = len(buf)
        buf += data
        end = len(buf)
        waiters = self._waiters.get(journal)
        if waiters:
            keep = []
            for offset, fut in waiters:
                if fut.done():
                    continue
                if end > offset:
                    fut.set_result(end)
                else:
                    keep.append((offset, fut))
            self._waiters[journal] = keep
        return MemoryCommit(journal, begin, end)
