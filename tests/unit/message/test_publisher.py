"""The Publisher: UUID sequencing, transactions and ACK intents, over MemoryJournals."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.errors import ValidationError
from gazette.labels import LabelSet, parse_selector
from gazette.local.tutorial import TUTORIAL_JOURNALS_YAML
from gazette.message.mapping import (
    MappingFunc,
    NoPartitions,
    Partition,
    StaticPartitions,
    modulo_mapping,
)
from gazette.message.publisher import (
    AckIntent,
    AppendClient,
    MemoryCommit,
    MemoryJournals,
    Publisher,
)
from gazette.message.uuid import (
    Clock,
    Flags,
    clock_of,
    flags_of,
    is_v1,
    parse,
    producer_of,
    to_str,
)
from gazette.protocol import JournalSpec
from gazette.protocol.trees import journal_changes_from_yaml

LINES = "test/lines"
PRODUCER = 0x0123456789AB


class Msg:
    """A message that carries a UUID; `validate` fails when told to."""

    def __init__(self, body: str = "", invalid: bool = False) -> None:
        self.body = body
        self.invalid = invalid
        self.uuid: int | None = None

    def get_uuid(self) -> int | None:
        return self.uuid

    def set_uuid(self, uuid: int) -> None:
        self.uuid = uuid

    def new_acknowledgement(self, journal: str) -> Msg:
        return Msg(f"ack:{journal}")

    def validate(self) -> None:
        if self.invalid:
            raise ValidationError("body", "is invalid")


class Plain:
    """An at-least-once message: it cannot hold a UUID."""

    def __init__(self, body: str = "") -> None:
        self.body = body

    def get_uuid(self) -> int | None:
        return None

    def set_uuid(self, uuid: int) -> None:
        pass

    def new_acknowledgement(self, journal: str) -> Plain:
        return Plain("ack")


class Lines:
    """One ``uuid|body`` line per message (``-`` for no UUID)."""

    content_type = LINES

    def encode(self, messages: Sequence[Any]) -> bytes:
        out = []
        for m in messages:
            u = m.get_uuid()
            out.append(f"{'-' if u is None else to_str(u)}|{m.body}\n")
        return "".join(out).encode()

    def decode(self, data: bytes, final: bool = False) -> tuple[list[Any], int]:
        raise NotImplementedError


def lines_framing(content_type: str) -> Lines:
    if content_type != LINES:
        raise ValidationError("content-type", f"no framing for {content_type!r}")
    return Lines()


def decode(data: bytes) -> list[tuple[int | None, str]]:
    """(uuid, body) of each line."""
    out = []
    for line in data.decode().splitlines():
        u, _, body = line.partition("|")
        out.append((None if u == "-" else parse(u), body))
    return out


class Fixed:
    """Partitions named by the test: ``test/0``, ``test/1``, ..."""

    def __init__(self, n: int, content_type: str = LINES) -> None:
        self.selector = parse_selector("prefix=test/")
        self.parts = tuple(Partition(f"test/{i}", content_type) for i in range(n))

    def current(self) -> tuple[Partition, ...]:
        return self.parts


def to(journal: str, content_type: str = LINES) -> MappingFunc:
    part = Partition(journal, content_type)
    return lambda msg: part


by_body = modulo_mapping(lambda m: m.body.encode(), Fixed(3))


class Recording:
    """An AppendClient that records calls, returning futures of `loop`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.calls: list[tuple[str, bytes]] = []

    def append(self, journal: str, data: bytes) -> asyncio.Future[Any]:
        self.calls.append((journal, data))
        return self.loop.create_future()


def publisher(client: AppendClient, **kw: Any) -> Publisher:
    kw.setdefault("producer", PRODUCER)
    return Publisher(client, framings=lines_framing, **kw)


# --- committed ---------------------------------------------------------------------------


async def test_publish_committed() -> None:
    journals = MemoryJournals()
    pub = publisher(journals)
    before = Clock()
    before.update()
    msg = Msg("hello")
    fut = pub.publish_committed(to("test/a"), msg)
    commit = await fut
    assert commit == MemoryCommit("test/a", 0, journals.head("test/a"))
    [(u, body)] = decode(journals.read("test/a"))
    assert (u, body) == (msg.uuid, "hello")
    assert u is not None and is_v1(u)
    assert producer_of(u) == PRODUCER == pub.producer
    assert flags_of(u) == Flags.OUTSIDE_TXN
    after = Clock()
    after.update()
    assert before.value < clock_of(u) <= after.value + 1  # the wall clock, ticked
    assert pub.build_ack_intents() == []  # committed messages open no transaction


async def test_at_least_once_messages_are_appended() -> None:
    journals = MemoryJournals()
    pub = publisher(journals)
    await pub.publish_committed(to("test/a"), Plain("one"))
    await pub.publish_uncommitted(to("test/a"), Plain("two"))
    assert decode(journals.read("test/a")) == [(None, "one"), (None, "two")]
    # Nothing to acknowledge: readers deliver them without waiting.
    assert pub.build_ack_intents() == []


async def test_default_producer_is_random() -> None:
    a, b = Publisher(MemoryJournals()), Publisher(MemoryJournals())
    assert a.producer != b.producer
    assert a.producer & (1 << 40)  # the multicast bit of non-MAC node ids
    assert 0 < a.producer < 1 << 48


@pytest.mark.parametrize("bad", [-1, 1 << 48, True, "1", 1.0])
def test_producer_must_be_48_bits(bad: Any) -> None:
    with pytest.raises(ValidationError, match="producer"):
        Publisher(MemoryJournals(), producer=bad)


# --- uncommitted and ACK intents ---------------------------------------------------------


async def test_publish_uncommitted_and_ack_intents() -> None:
    journals = MemoryJournals()
    pub = publisher(journals)
    msgs = [Msg(f"m{i}") for i in range(12)]
    futs = [pub.publish_uncommitted(by_body, m) for m in msgs]
    await asyncio.gather(*futs)
    written = list(dict.fromkeys(by_body(m).journal for m in msgs))  # first-write order
    assert len(written) == 3
    assert pub.transaction_journals == tuple(written)
    for m in msgs:
        assert m.uuid is not None
        assert flags_of(m.uuid) == Flags.CONTINUE_TXN
        assert producer_of(m.uuid) == PRODUCER

    intents = pub.build_ack_intents()
    assert [i.journal for i in intents] == written
    assert pub.transaction_journals == ()
    top = max(clock_of(m.uuid) for m in msgs if m.uuid is not None)
    for intent in intents:
        assert isinstance(intent, AckIntent)
        [(u, body)] = decode(intent.data)
        assert body == f"ack:{intent.journal}"
        assert u is not None and flags_of(u) == Flags.ACK_TXN and producer_of(u) == PRODUCER
        assert clock_of(u) > top
    assert len({decode(i.data)[0][0] for i in intents}) == 3  # a tick each

    # The transaction was reset: the next one covers only what it writes.
    assert pub.build_ack_intents() == []
    pub.publish_uncommitted(to("test/x"), Msg("later"))
    pub.publish_committed(to("test/y"), Msg("outside"))
    assert [i.journal for i in pub.build_ack_intents()] == ["test/x"]


async def test_publish_acks() -> None:
    journals = MemoryJournals()
    pub = publisher(journals)
    pub.publish_uncommitted(to("test/a"), Msg("one"))
    pub.publish_uncommitted(to("test/b"), Msg("two"))
    pub.publish_uncommitted(to("test/a"), Msg("three"))
    commits = await asyncio.gather(*pub.publish_acks())
    assert [c.journal for c in commits] == ["test/a", "test/b"]
    a = decode(journals.read("test/a"))
    assert [body for _, body in a] == ["one", "three", "ack:test/a"]
    assert [flags_of(u) for u, _ in a if u is not None] == [
        Flags.CONTINUE_TXN, Flags.CONTINUE_TXN, Flags.ACK_TXN]
    assert pub.publish_acks() == []


# --- clocks ------------------------------------------------------------------------------


def journal_clocks(journals: MemoryJournals) -> dict[str, list[int]]:
    return {
        j: [clock_of(u) for u, _ in decode(journals.read(j)) if u is not None]
        for j in journals.journals
    }


async def test_clocks_increase_per_journal() -> None:
    journals = MemoryJournals()
    pub = publisher(journals)
    for i in range(300):
        m = Msg(f"m{i}")
        if i % 3:
            pub.publish_uncommitted(by_body, m)
        else:
            pub.publish_committed(by_body, m)
        if i % 50 == 49:
            pub.publish_acks()
    clocks = journal_clocks(journals)
    assert len(clocks) == 3
    for seq in clocks.values():
        assert seq == sorted(set(seq))


async def test_caller_clock_is_only_ticked() -> None:
    clock = Clock(Clock.from_unix(1_000_000_000.0))  # 2001: far behind the wall
    start = clock.value
    journals = MemoryJournals()
    pub = publisher(journals, clock=clock)
    assert pub.clock is clock
    for i in range(40):
        pub.publish_uncommitted(by_body, Msg(f"m{i}"))
    pub.publish_acks()
    # Ticks only: 40 messages and 3 ACKs take the clock values after `start`, in order.
    assert clock.value == start + 43
    every = sorted(c for seq in journal_clocks(journals).values() for c in seq)
    assert every == list(range(start + 1, start + 44))
    for seq in journal_clocks(journals).values():
        assert seq == sorted(seq)
        assert seq[-1] == max(seq)  # the ACK is last and largest


def test_own_clock_follows_the_wall() -> None:
    loop = asyncio.new_event_loop()
    try:
        client = Recording(loop)
        pub = publisher(client)
        m = Msg("x")
        pub.publish_committed(to("test/a"), m)
        assert m.uuid is not None
        wall = Clock.from_unix(time.time())
        assert abs(clock_of(m.uuid) - wall) < Clock.from_unix(60) - Clock.from_unix(0)
    finally:
        loop.close()


# --- the client --------------------------------------------------------------------------


def test_appends_go_through_the_client_in_call_order() -> None:
    loop = asyncio.new_event_loop()
    try:
        client = Recording(loop)
        pub = publisher(client)
        expect = []
        for i in range(30):
            m = Msg(f"m{i}")
            fut = (pub.publish_uncommitted if i % 2 else pub.publish_committed)(by_body, m)
            assert fut is not None and not fut.done()
            expect.append((by_body(m).journal, f"m{i}"))
        got = [(j, decode(data)[0][1]) for j, data in client.calls]
        assert got == expect
        # One frame per append: the data the framing encoded, handed over as is.
        assert all(data.count(b"\n") == 1 for _, data in client.calls)
    finally:
        loop.close()


async def test_futures_resolve_when_appends_commit() -> None:
    journals = MemoryJournals()
    pub = publisher(journals)
    journals.hold("test/a")
    first = pub.publish_committed(to("test/a"), Msg("one"))
    other = pub.publish_committed(to("test/b"), Msg("other"))
    second = pub.publish_committed(to("test/a"), Msg("two"))
    await asyncio.sleep(0)
    assert other.done() and not first.done() and not second.done()
    assert journals.pending("test/a") == 2 and journals.read("test/a") == b""
    journals.release("test/a")
    one, two = await first, await second
    assert one.end == two.begin and two.end == journals.head("test/a")
    assert [b for _, b in decode(journals.read("test/a"))] == ["one", "two"]

    journals.hold()
    failed = pub.publish_committed(to("test/a"), Msg("lost"))
    journals.fail(ConnectionError("broker gone"))
    with pytest.raises(ConnectionError, match="broker gone"):
        await failed
    held = pub.publish_committed(to("test/a"), Msg("three"))  # still held
    assert not held.done()
    journals.release()
    await held
    assert [b for _, b in decode(journals.read("test/a"))] == ["one", "two", "three"]


# --- errors ------------------------------------------------------------------------------


async def test_validate_errors_propagate_and_nothing_is_appended() -> None:
    journals = MemoryJournals()
    clock = Clock(1000)
    pub = publisher(journals, clock=clock)
    for publish in (pub.publish_committed, pub.publish_uncommitted):
        bad = Msg("bad", invalid=True)
        with pytest.raises(ValidationError, match="body: is invalid"):
            publish(to("test/a"), bad)
        assert bad.uuid is None
    assert journals.journals == [] and clock.value == 1000
    assert pub.build_ack_intents() == []


def failing_key(msg: Any) -> bytes:
    raise KeyError("user")


@pytest.mark.parametrize(
    ("mapping", "error"),
    [
        (modulo_mapping(lambda m: m.body.encode(), Fixed(0)), NoPartitions),
        (modulo_mapping(failing_key, Fixed(3)), KeyError),
        (to("test/a", "text/unknown"), ValidationError),
        (to("test/a", ""), ValidationError),
    ],
    ids=["no-partitions", "key-error", "unknown-content-type", "no-content-type"],
)
async def test_mapping_errors_propagate_and_nothing_is_appended(
        mapping: MappingFunc, error: type[Exception]) -> None:
    journals = MemoryJournals()
    clock = Clock(1000)
    pub = publisher(journals, clock=clock)
    pub.publish_uncommitted(to("test/open"), Msg("open"))
    for publish in (pub.publish_committed, pub.publish_uncommitted):
        m = Msg("x")
        with pytest.raises(error):
            publish(mapping, m)
        assert m.uuid is None
    assert journals.journals == ["test/open"] and clock.value == 1001
    assert pub.transaction_journals == ("test/open",)


async def test_missing_content_type_is_named() -> None:
    pub = publisher(MemoryJournals())
    with pytest.raises(ValidationError, match="'test/a' has no content-type label"):
        pub.publish_committed(to("test/a", ""), Msg())


async def test_framing_resolved_once_per_content_type() -> None:
    asked: list[str] = []

    def framings(content_type: str) -> Lines:
        asked.append(content_type)
        return Lines()

    pub = Publisher(MemoryJournals(), framings=framings)
    for i in range(20):
        pub.publish_committed(by_body, Msg(f"m{i}"))
        pub.publish_uncommitted(by_body, Msg(f"m{i}"))
    pub.publish_acks()
    assert asked == [LINES]


async def test_publish_to_the_tutorial_partitions() -> None:
    specs = [c.spec for c in journal_changes_from_yaml(TUTORIAL_JOURNALS_YAML) if c.spec]
    topic = StaticPartitions(specs, parse_selector("prefix=foobar/"))
    asked: list[str] = []

    def framings(content_type: str) -> Lines:
        asked.append(content_type)
        return Lines()

    journals = MemoryJournals()
    pub = Publisher(journals, framings=framings)
    mapping = modulo_mapping(lambda m: m.body.encode(), topic)
    await asyncio.gather(*(pub.publish_committed(mapping, Msg(f"m{i}")) for i in range(30)))
    assert journals.journals == ["foobar/part-000", "foobar/part-001", "foobar/part-002"]
    assert asked == ["application/x-ndjson"]


async def test_default_framings_come_from_the_registry() -> None:
    """An unregistered content type is a ValidationError naming it."""
    spec = JournalSpec("test/odd", labels=LabelSet({"content-type": "x-test/unregistered"}))
    parts = StaticPartitions([spec], parse_selector("prefix=test/"))
    journals = MemoryJournals()
    pub = Publisher(journals)
    with pytest.raises(ValidationError, match="x-test/unregistered"):
        pub.publish_committed(modulo_mapping(lambda m: b"", parts), Msg())
    assert journals.journals == []


# --- memory journals ---------------------------------------------------------------------


async def test_memory_journals_read_back() -> None:
    journals = MemoryJournals()
    waiter = asyncio.ensure_future(journals.wait_beyond("test/a", 4))
    assert await journals.wait_beyond("test/b", -1) == 0  # already beyond: no wait
    await journals.append("test/a", b"abc")
    await asyncio.sleep(0)
    assert not waiter.done()
    assert await journals.append("test/a", b"defg") == MemoryCommit("test/a", 3, 7)
    assert await waiter == 7
    assert journals.read("test/a") == b"abcdefg"
    assert journals.read("test/a", 2, 5) == b"cde"
    assert journals.read("test/none") == b"" and journals.head("test/none") == 0
    assert journals.journals == ["test/a"]


# --- a model of interleaved publishing ---------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("cua"), st.integers(0, 4)), max_size=60))
def test_interleavings_keep_the_transaction_invariants(ops: list[tuple[str, int]]) -> None:
    """Any mix of committed, uncommitted and ACK-building: each journal's clocks rise in
    append order, and each ACK covers exactly the journals written since the last one,
    with a clock above all their pending messages."""
    loop = asyncio.new_event_loop()
    try:
        client = Recording(loop)
        pub = publisher(client, clock=Clock(1 << 20))
        open_txn: dict[str, int] = {}  # journal -> largest pending clock
        for op, n in ops:
            if op == "a":
                intents = pub.build_ack_intents()
                assert [i.journal for i in intents] == list(open_txn)
                for intent in intents:
                    [(u, _)] = decode(intent.data)
                    assert u is not None and flags_of(u) == Flags.ACK_TXN
                    assert clock_of(u) > open_txn[intent.journal]
                    client.append(intent.journal, intent.data)
                open_txn = {}
                continue
            m = Msg(str(n))
            journal = f"test/{n}"
            if op == "c":
                pub.publish_committed(to(journal), m)
            else:
                pub.publish_uncommitted(to(journal), m)
                assert m.uuid is not None
                open_txn[journal] = clock_of(m.uuid)
        last: dict[str, int] = {}
        for journal, data in client.calls:
            [(u, _)] = decode(data)
            assert u is not None and producer_of(u) == PRODUCER
            assert clock_of(u) > last.get(journal, 0)
            last[journal] = clock_of(u)
    finally:
        loop.close()
