"""The journal client against a real broker on loopback (etcd included).

Faults are made honestly: a TCP relay between client and broker (`Relay`) cuts its
connections, or holds back one direction, at points the test picks (after so many bytes,
or once the client has sent the end of an append's stream), so the client meets real
broken connections rather than a fake broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import os
import random
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest

import gazette.client.appends as appends_module
import gazette.client.fetch as fetch
from gazette.client import (
    AppendQueue,
    AppendResult,
    AppendUncertain,
    ApplyConflict,
    BrokerError,
    JournalClient,
    ReadChunk,
    RetryPolicy,
    Unavailable,
    fetch_fragment,
)
from gazette.client.metrics import READ_BYTES, RETRIES
from gazette.errors import ValidationError
from gazette.fragment import CorruptFragment
from gazette.labels import LabelSet, Selector
from gazette.message import (
    JsonMessage,
    Publisher,
    Sequencer,
    StaticPartitions,
    framing_for,
    modulo_mapping,
    read_committed,
    read_uncommitted,
)
from gazette.pb import broker_pb2 as pb
from gazette.protocol import JournalSpec
from gazette.protocol.content import AppendContent
from gazette.protocol.trees import SpecChange
from gazette_broker import BrokerServer, JournalService, add_journal_service
from gazette_broker.routing import JournalRouting
from tests.fixtures.broker import persist, plain_server
from tests.fixtures.polling import eventually
from tests.fixtures.relay import Relay
from tests.fixtures.s3 import S3Bucket

pytestmark = pytest.mark.integration

MiB = 1 << 20
SPECS = """
name: test/
replication: 1
labels: [{name: content-type, value: application/x-ndjson}]
fragment:
  length: 1073741824
  compression_codec: SNAPPY
  stores: ["file:///"]
  refresh_interval: 1h0m0s
children:
  - name: test/a
  - name: test/b
  - name: test/raw
    fragment: {compression_codec: NONE}
"""
FAST_RETRY = RetryPolicy(attempts=20, initial_delay=0.02, max_delay=0.2)


async def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll `check` until it holds, under a deadline."""
    async with asyncio.timeout(timeout):
        while True:
            if check():
                return
            await asyncio.sleep(0.005)


@pytest.fixture
async def broker(broker_server: BrokerServer) -> BrokerServer:
    await broker_server.apply_yaml(SPECS)
    return broker_server


@pytest.fixture
async def client(broker: BrokerServer) -> AsyncIterator[JournalClient]:
    async with JournalClient(broker.grpc_address, retry=FAST_RETRY) as c:
        yield c


async def read_all(client: JournalClient, journal: str, offset: int = 0, **kw: Any
                   ) -> list[ReadChunk]:
    return [c async for c in client.read(journal, offset, **kw)]


def joined(chunks: list[ReadChunk]) -> bytes:
    for a, b in itertools.pairwise(chunks):
        assert b.offset == a.end, "chunks are contiguous"
    return b"".join(c.content for c in chunks)


def head(broker: BrokerServer, journal: str) -> int:
    return broker.broker.replicas[journal].write_head


# -- a relay whose connections a test can cut ------------------------------------------


@pytest.fixture
async def relay(broker: BrokerServer) -> AsyncIterator[Relay]:
    async with Relay(broker.grpc_address) as r:
        yield r


@pytest.fixture
async def relayed(relay: Relay) -> AsyncIterator[JournalClient]:
    # (All its calls go through the relay: none on a data path, which is direct.)
    async with JournalClient(relay.address, retry=FAST_RETRY, data_path=False) as c:
        await c.write_head("test/a")  # connected (HTTP/2 settings exchanged)
        yield c


# -- appends and reads -----------------------------------------------------------------


async def test_append_and_read_round_trip(client: JournalClient) -> None:
    big = os.urandom(3 * MiB + 12345)

    async def streamed() -> AsyncIterator[bytes]:
        for i in range(100):
            yield b"%05d\n" % i

    parts = [b"small\n", big, [b"many ", b"little ", b"chunks\n"] * 1000,
             memoryview(bytearray(b"a view\n")), bytearray(b"a bytearray\n"), streamed()]
    expected = b"small\n" + big + b"many little chunks\n" * 1000 + b"a view\n" \
        + b"a bytearray\n" + b"".join(b"%05d\n" % i for i in range(100))
    at = 0
    for part in parts:
        result = await client.append("test/a", part)  # type: ignore[arg-type]
        assert isinstance(result, AppendResult)
        assert result.commit.begin == at and result.commit.journal == "test/a"
        at = result.commit.end
    assert at == len(expected) == await client.write_head("test/a")

    chunks = await read_all(client, "test/a")
    assert joined(chunks) == expected
    assert all(len(c.content) <= MiB for c in chunks) and chunks[-1].write_head == at
    assert joined(await read_all(client, "test/a", 1000, end_offset=MiB * 2)) \
        == expected[1000:MiB * 2]
    assert joined(await read_all(client, "test/a", at - 5)) == expected[-5:]
    assert await read_all(client, "test/a", at) == []  # at the head: nothing, cleanly
    assert await read_all(client, "test/a", -1) == []
    commit = (await client.append("test/b", b"x" * 10)).commit
    assert commit.sha1 == hashlib.sha1(b"x" * 10).digest()


async def test_expected_offsets_and_registers(client: JournalClient) -> None:
    first = await client.append("test/a", b"one\n", union_registers=LabelSet([("owner", "me")]))
    assert first.registers == LabelSet([("owner", "me")])
    second = await client.append("test/a", b"two\n", offset=first.commit.end,
                                 check_registers=Selector.parse("owner=me"))
    assert second.commit.begin == 4
    with pytest.raises(BrokerError) as err:
        await client.append("test/a", b"late\n", offset=4)
    assert err.value.status == "WRONG_APPEND_OFFSET" and err.value.journal == "test/a"
    assert "WRONG_APPEND_OFFSET" in str(err.value) and "test/a" in str(err.value)
    with pytest.raises(BrokerError) as err:
        await client.append("test/a", b"fenced\n", check_registers=Selector.parse("owner=you"))
    assert err.value.status == "REGISTER_MISMATCH"
    third = await client.append("test/a", b"three\n",
                                subtract_registers=LabelSet([("owner", "me")]))
    assert third.registers == LabelSet()
    assert joined(await read_all(client, "test/a")) == b"one\ntwo\nthree\n"


async def test_errors_name_the_journal_and_field(client: JournalClient) -> None:
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: client.append("test/missing", b"x"),
        lambda: client.write_head("test/missing"),
        lambda: read_all(client, "test/missing"),
        lambda: read_all(client, "test/missing", direct=True),
        lambda: client.list_fragments("test/missing")]
    for call in calls:
        with pytest.raises(BrokerError) as err:
            await call()
        assert err.value.status == "JOURNAL_NOT_FOUND" and err.value.journal == "test/missing"
    # Refused while the client is still writing: the broker's answer, not a failed write.
    for _ in range(3):
        with pytest.raises(BrokerError, match="JOURNAL_NOT_FOUND"):
            await client.append("test/missing", os.urandom(8 * MiB))
    with pytest.raises(ValidationError, match="journal"):
        await client.append("bad//name", b"x")
    with pytest.raises(ValidationError, match="content"):
        await client.append("test/a", "text")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="offset"):
        await read_all(client, "test/a", -2)
    with pytest.raises(ValidationError, match="selector"):
        await client.list("name in (")
    with pytest.raises(ValidationError, match="address"):
        JournalClient("not an address")
    async with JournalClient("127.0.0.1:1", retry=RetryPolicy(attempts=2)) as nowhere:
        with pytest.raises(Unavailable) as down:
            await nowhere.write_head("test/a")
        assert down.value.code == "UNAVAILABLE" and "127.0.0.1:1" in str(down.value)
        assert "after 2 attempts" in str(down.value) and "test/a" in str(down.value)
    with pytest.raises(Unavailable, match="closed"):
        await nowhere.append("test/a", b"x")


async def test_a_blocking_reader_follows_appends(client: JournalClient) -> None:
    await client.append("test/a", b"before\n")
    start = await client.write_head("test/a")
    got: list[ReadChunk] = []

    async def follow() -> None:
        async for chunk in client.read("test/a", start, block=True):
            got.append(chunk)

    reader = asyncio.create_task(follow())
    try:
        for i in range(5):
            await client.append("test/a", b"after %d\n" % i)
        await until(lambda: sum(len(c.content) for c in got) >= 5 * 8)
        assert joined(got) == b"".join(b"after %d\n" % i for i in range(5))
        assert got[0].offset == 7
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)


# -- faults ----------------------------------------------------------------------------


async def test_a_reader_resumes_where_it_was_cut_off(
        client: JournalClient, relayed: JournalClient, relay: Relay) -> None:
    data = os.urandom(16 * MiB)
    await client.append("test/a", data)
    got: list[ReadChunk] = []
    async with contextlib.aclosing(relayed.read("test/a", 100)) as chunks:
        async for chunk in chunks:
            got.append(chunk)
            if len(got) in (1, 3):
                relay.cut()
    assert joined(got) == data[100:]
    # At least the first cut forced a new connection (by the second, what was left may
    # already have been received: gRPC's flow-control window grows to several MiB).
    assert relay.connections >= 2

    # A blocking reader too: cut while it waits, then appends arrive.
    followed: list[ReadChunk] = []

    async def follow() -> None:
        async for chunk in relayed.read("test/a", len(data) - 10, block=True):
            followed.append(chunk)

    reader = asyncio.create_task(follow())
    try:
        await until(lambda: len(followed) == 1)
        relay.cut()
        await client.append("test/a", b"more\n")
        await until(lambda: sum(len(c.content) for c in followed) == 15)
        assert joined(followed) == data[-10:] + b"more\n"
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)


async def test_an_append_cut_before_its_commit_lands_once(
        broker: BrokerServer, client: JournalClient, relayed: JournalClient,
        relay: Relay) -> None:
    data = os.urandom(12 * MiB)
    retries = RETRIES.labels("append")._value.get()
    relay.arm()
    relay.hold_up = True  # gRPC's flow control stalls the client after a few MiB
    append = asyncio.create_task(relayed.append("test/a", data))
    await until(lambda: relay.up_bytes >= 2 * MiB)
    assert not relay.end_of_stream.is_set()  # the commit was not sent
    relay.cut()
    result = await append
    assert RETRIES.labels("append")._value.get() > retries
    assert (result.commit.begin, result.commit.end) == (0, len(data))
    assert head(broker, "test/a") == len(data)
    assert joined(await read_all(client, "test/a")) == data


async def test_a_lost_commit_answer_is_uncertain_without_an_offset(
        broker: BrokerServer, relayed: JournalClient, relay: Relay) -> None:
    relay.hold_down = True  # the broker's answer never reaches the client
    append = asyncio.create_task(relayed.append("test/a", b"did it land?\n"))
    await until(lambda: head(broker, "test/a") == 13)  # the broker committed it
    relay.cut()
    with pytest.raises(AppendUncertain) as err:
        await append
    assert err.value.journal == "test/a" and "test/a" in str(err.value)


async def test_a_lost_answer_to_an_empty_append_is_sent_again(
        client: JournalClient, relayed: JournalClient, relay: Relay) -> None:
    # An empty append (how a recovery log's registers are read) writes no content: its
    # lost answer leaves nothing in doubt, so it is sent again rather than uncertain.
    await client.append("test/a", b"0123456789")
    relay.arm()
    relay.hold_down = True
    append = asyncio.create_task(relayed.append("test/a", b""))
    await asyncio.wait_for(relay.end_of_stream.wait(), 10)  # sent; its answer held
    relay.cut()
    result = await asyncio.wait_for(append, 10)
    assert (result.commit.begin, result.commit.end) == (10, 10)


async def test_a_lost_commit_answer_with_an_offset_is_resolved(
        broker: BrokerServer, client: JournalClient, relayed: JournalClient,
        relay: Relay, monkeypatch: pytest.MonkeyPatch) -> None:
    await client.append("test/a", b"0123456789")
    # It committed, the answer was lost: sent again, WRONG_APPEND_OFFSET, read back, ours.
    relay.hold_down = True
    append = asyncio.create_task(relayed.append("test/a", b"mine\n", offset=10))
    await until(lambda: head(broker, "test/a") == 15)
    relay.cut()
    summed_on: list[threading.Thread] = []
    sum_into = appends_module._sum_into

    def watched(sha1: Any, parts: Any) -> None:
        summed_on.append(threading.current_thread())
        sum_into(sha1, parts)

    monkeypatch.setattr(appends_module, "_sum_into", watched)
    result = await append
    assert (result.commit.begin, result.commit.end) == (10, 15)
    assert result.commit.sha1 == hashlib.sha1(b"mine\n").digest()
    # Both SHA-1s (of the append, of what is there) were summed off the event loop.
    assert summed_on and threading.current_thread() not in summed_on

    # The commit never reached the broker: sent again, it lands once.
    relay.arm()
    relay.hold_up = True
    append = asyncio.create_task(relayed.append("test/a", b"again\n", offset=15))
    await asyncio.wait_for(relay.end_of_stream.wait(), 10)  # the client sent its commit
    assert head(broker, "test/a") == 15
    relay.cut()
    result = await append
    assert (result.commit.begin, result.commit.end) == (15, 21)

    # Someone else wrote at the offset meanwhile: the append failed, nothing of it landed.
    relay.arm()
    relay.hold_up = True
    append = asyncio.create_task(relayed.append("test/a", b"lost\n", offset=21))
    await asyncio.wait_for(relay.end_of_stream.wait(), 10)
    await client.append("test/a", b"other\n")
    relay.cut()
    with pytest.raises(BrokerError) as err:
        await append
    assert err.value.status == "WRONG_APPEND_OFFSET"
    assert joined(await read_all(client, "test/a")) == b"0123456789mine\nagain\nother\n"


class CountingService(JournalService):
    """The broker's service, counting AppendWhole calls; `whole=False` answers them
    UNIMPLEMENTED, as a broker predating AppendWhole would."""

    whole = True
    whole_calls = 0

    def __init__(self, routing: JournalRouting) -> None:
        super().__init__(routing)
        served = self.AppendWhole

        async def counted(request: AppendContent, context: Any) -> pb.AppendResponse:
            self.whole_calls += 1
            if not self.whole:
                await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
            return await served(request, context)

        self.AppendWhole = counted


async def test_appends_that_fit_a_message_take_one_append_whole_call(
        broker: BrokerServer) -> None:
    service = CountingService(JournalRouting(broker.broker.replicas))
    server = plain_server()
    add_journal_service(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with JournalClient(f"127.0.0.1:{port}", retry=FAST_RETRY) as c:
            await c.append("test/a", b"first\n")  # connecting: by stream
            await c.append("test/a", b"whole\n")  # connected: one unary call
            assert service.whole_calls == 1
            await c.append("test/a", [b"x" * MiB, b"y\n"])  # two messages: by stream
            await c.append("test/a", b"")  # empty: by stream
            assert service.whole_calls == 1
            service.whole = False  # an older broker: falls back to streams, for good
            result = await c.append("test/a", b"older\n")
            assert service.whole_calls == 2
            await c.append("test/a", b"again\n")
            assert service.whole_calls == 2
        async with JournalClient(broker.grpc_address) as direct:
            everything = joined(await read_all(direct, "test/a"))
        assert everything == b"first\nwhole\n" + b"x" * MiB + b"y\nolder\nagain\n"
        assert result.commit.end - result.commit.begin == 6
    finally:
        await server.stop(None)


# -- the append queue and the Publisher --------------------------------------------------


async def test_append_queue_keeps_call_order_and_coalesces(client: JournalClient) -> None:
    rng = random.Random(7)
    queue = AppendQueue(client, max_batch_bytes=256 << 10, max_pending_bytes=1 * MiB)
    sent: dict[str, list[bytes]] = {"test/a": [], "test/b": []}
    futures: list[tuple[str, bytes, asyncio.Future[AppendResult]]] = []
    peak = 0
    for i in range(3000):
        journal = rng.choice(["test/a", "test/b"])
        data = b"%s %05d %s\n" % (journal.encode(), i, b"x" * rng.randrange(0, 2000))
        await queue.wait_for_room()
        futures.append((journal, data, queue.append(journal, data)))
        sent[journal].append(data)
        peak = max(peak, queue.pending_bytes)
    await queue.close()
    assert peak <= 1 * MiB + 2100  # backpressure held (at most one append over)
    assert all(f.done() and not f.cancelled() and f.exception() is None for _, _, f in futures)
    commits = {(j, f.result().commit.begin) for j, _, f in futures}
    assert len(commits) < len(futures) / 10  # coalesced into far fewer RPCs
    for journal, data, fut in futures:  # each append lies whole inside its batch's commit
        commit = fut.result().commit
        assert commit.journal == journal and commit.size >= len(data)
    for journal, parts in sent.items():
        assert joined(await read_all(client, journal)) == b"".join(parts)
    with pytest.raises(Exception, match="closed"):
        queue.append("test/a", b"x")


async def test_append_queue_fails_futures_of_a_refused_batch(client: JournalClient) -> None:
    async with AppendQueue(client) as queue:
        bad = [queue.append("test/missing", b"x") for _ in range(3)]
        good = queue.append("test/a", b"fine\n")
        await queue.flush()
    for fut in bad:
        with pytest.raises(BrokerError, match="JOURNAL_NOT_FOUND"):
            fut.result()
    assert good.result().commit.end == 5


async def test_append_queue_closed_without_flush_gives_up_a_resend() -> None:
    # A resending queue whose brokers are unreachable never commits: closing it without
    # a flush (and leaving its context on an error) cancels what waits, at once.
    async with JournalClient("127.0.0.1:1", retry=RetryPolicy(attempts=1)) as nowhere:
        queue = AppendQueue(nowhere, resend=True)
        fut = queue.append("test/a", b"lost\n")
        await asyncio.wait_for(queue.close(flush=False), 5)
        assert fut.cancelled() and queue.pending_bytes == 0

        with pytest.raises(RuntimeError, match="the caller failed"):
            async with AppendQueue(nowhere, resend=True) as failing:
                pending = failing.append("test/a", b"lost\n")
                raise RuntimeError("the caller failed")
        assert pending.cancelled()


async def test_publisher_over_the_append_queue(broker: BrokerServer,
                                               client: JournalClient) -> None:
    listing = await client.list("prefix=test/, name not in (test/raw)")
    partitions = StaticPartitions([j.spec for j in listing.journals],
                                  Selector.parse("prefix=test/"))
    mapping = modulo_mapping(lambda m: str(m["n"]).encode(), partitions)
    async with AppendQueue(client) as queue:
        publisher = Publisher(queue)
        futures = [publisher.publish_committed(mapping, JsonMessage(n=n)) for n in range(500)]
        for n in range(500, 510):
            futures.append(publisher.publish_uncommitted(mapping, JsonMessage(n=n)))
        futures += publisher.publish_acks()
        await asyncio.gather(*futures)

    framing = framing_for("application/x-ndjson")

    async def content(journal: str, begin: int = 0, end: int = 0) -> AsyncIterator[bytes]:
        async for chunk in client.read(journal, begin, end_offset=end):
            yield chunk.content

    async def replay(journal: str, begin: int, end: int) -> AsyncIterator[list[Any]]:
        async for batch in read_uncommitted(journal, content(journal, begin, end), framing,
                                            offset=begin):
            yield batch

    seen: list[int] = []
    sequencer = Sequencer()
    for journal in ("test/a", "test/b"):
        batches = read_uncommitted(journal, content(journal), framing)
        async for committed in read_committed(batches, sequencer, replay):
            seen.extend(env.message["n"] for env in committed)
    assert sorted(seen) == list(range(510))


# -- listings, watches and specs -------------------------------------------------------


async def test_list_apply_and_watch(broker: BrokerServer, client: JournalClient) -> None:
    listing = await client.list("prefix=test/")
    assert [j.spec.name for j in listing.journals] == ["test/a", "test/b", "test/raw"]
    assert listing.revision > 0
    assert all(j.route.primary_id for j in listing.journals)

    updates: asyncio.Queue[Any] = asyncio.Queue()

    async def watch() -> None:
        async for snapshot in client.watch(Selector.parse("prefix=new/")):
            await updates.put(snapshot)

    watcher = asyncio.create_task(watch())
    try:
        first = await asyncio.wait_for(updates.get(), 10)
        assert first.journals == []
        spec = JournalSpec("new/one", replication=1, labels=LabelSet([("team", "x")]))
        applied = await client.apply([SpecChange("new/one", 0, spec)])
        revision = applied.revision
        # Applied, with a warning: a journal without stores never persists anything.
        assert [w for w in applied.warnings if "no fragment stores" in w] == [
            "new/one: no fragment stores: its content is never persisted, and is lost "
            "when its brokers stop (set fragment.stores)"]
        listed = (await client.list("team=x")).journals
        assert [(j.spec, j.mod_revision) for j in listed] == [(spec, revision)]
        seen = await asyncio.wait_for(updates.get(), 10)
        assert [j.spec.name for j in seen.journals] == ["new/one"]

        with pytest.raises(ApplyConflict) as err:  # "must not exist" but it does
            await client.apply([SpecChange("new/one", 0, spec)])
        assert err.value.status == "ETCD_TRANSACTION_FAILED" and err.value.revision >= revision
        assert "new/one" in str(err.value)
        deleted = await client.apply([SpecChange("new/one", revision, None)])
        assert deleted.revision > revision and deleted.warnings == ()
        while (await asyncio.wait_for(updates.get(), 10)).journals:
            pass  # the deletion shows up in the watch
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)


async def test_a_watch_reconnects_after_a_cut(client: JournalClient, relayed: JournalClient,
                                              relay: Relay) -> None:
    async with contextlib.aclosing(relayed.watch("prefix=new/")) as updates:
        assert (await asyncio.wait_for(anext(updates), 10)).journals == []
        relay.cut()
        await client.apply([SpecChange("new/one", 0, JournalSpec("new/one", replication=1))])
        async with asyncio.timeout(10):
            async for listing in updates:
                if [j.spec.name for j in listing.journals] == ["new/one"]:
                    break
    assert relay.connections >= 2


# -- fragments and direct reads --------------------------------------------------------


async def test_fragments_are_listed_page_by_page(broker: BrokerServer,
                                                 client: JournalClient) -> None:
    parts = [b'{"part": %d}\n' % i * (i + 1) for i in range(5)]
    await persist(broker, client, "test/a", parts)
    pages = [page async for page in client.fragments("test/a", page_limit=2)]
    assert [len(p) for p in pages] == [2, 2, 1]
    infos = await client.list_fragments("test/a", page_limit=2,
                                        signature_ttl=timedelta(minutes=5))
    assert [i.fragment for p in pages for i in p] == [i.fragment for i in infos]
    assert [i.fragment.begin for i in infos[1:]] == [i.fragment.end for i in infos[:-1]]
    for info, part in zip(infos, parts, strict=True):
        assert info.fragment.backing_store and info.signed_url.startswith("file://")
        assert b"".join([c async for c in fetch_fragment(info.signed_url, info.fragment)]) \
            == part
    assert await client.list_fragments("test/b") == []
    with pytest.raises(ValidationError) as err:  # the broker's INVALID_ARGUMENT
        await client.list_fragments("test/a", page_limit=20_000)
    assert err.value.field == "page_limit"


async def test_direct_reads_fetch_persisted_fragments(broker: BrokerServer,
                                                      client: JournalClient) -> None:
    parts = [os.urandom(300_000) for _ in range(3)]
    await persist(broker, client, "test/a", parts)
    await client.append("test/a", b"not persisted yet\n")
    expected = b"".join(parts) + b"not persisted yet\n"
    from_store = READ_BYTES.labels("store")._value.get()
    chunks = await read_all(client, "test/a", 1000, direct=True)
    assert joined(chunks) == expected[1000:]
    assert READ_BYTES.labels("store")._value.get() - from_store == len(expected) - 1000 - 18
    bounded = await read_all(client, "test/a", 5, direct=True, end_offset=400_000)
    assert joined(bounded) == expected[5:400_000]

    # A blocking direct reader hands over to the broker at the open fragment.
    got: list[ReadChunk] = []

    async def follow() -> None:
        async for chunk in client.read("test/a", 299_990, block=True, direct=True):
            got.append(chunk)

    reader = asyncio.create_task(follow())
    try:
        await client.append("test/a", b"later\n")
        await until(lambda: sum(len(c.content) for c in got) == len(expected) - 299_990 + 6)
        assert joined(got) == expected[299_990:] + b"later\n"
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)


async def test_direct_reads_fetch_the_next_fragment_meanwhile(broker: BrokerServer,
                                                             client: JournalClient) -> None:
    # Fragments of several chunks each: the next one is fetched and verified while the
    # one before it is served, and every byte comes once, in order.
    parts = [os.urandom(2 * MiB + 1000 * i) for i in range(4)]
    await persist(broker, client, "test/raw", parts)
    expected = b"".join(parts)
    chunks = await read_all(client, "test/raw", 0, direct=True)
    assert joined(chunks) == expected and chunks[0].offset == 0
    bounded = await read_all(client, "test/raw", MiB, direct=True, end_offset=7 * MiB)
    assert joined(bounded) == expected[MiB:7 * MiB] and bounded[0].offset == MiB
    # A reader that stops in the middle leaves no fetch (nor generator) running.
    tasks = asyncio.all_tasks()
    async with contextlib.aclosing(client.read("test/raw", 0, direct=True)) as reader:
        async for chunk in reader:
            if chunk.end > 3 * MiB:
                break

    def left() -> list[str]:
        return [c for c in (repr(t.get_coro()) for t in asyncio.all_tasks() - tasks)
                if "_fetch_ahead" in c or "async_generator" in c]

    # (Closing the generators takes the loop a few turns; more on a loaded machine, where
    # one turn left an async_generator_athrow pending.)
    await eventually(lambda: not left(), "no fetch nor generator is left running", 5)


async def test_a_corrupt_stored_fragment_is_never_served(broker: BrokerServer,
                                                         client: JournalClient) -> None:
    parts = [b"good content\n" * 100, b"will be corrupted\n" * 100]
    await persist(broker, client, "test/raw", parts)
    infos = await client.list_fragments("test/raw")
    path = Path(broker.file_root or "") / infos[1].fragment.path
    assert path.exists()
    corrupt = bytearray(path.read_bytes())
    corrupt[50] ^= 0xFF
    path.write_bytes(bytes(corrupt))
    got: list[ReadChunk] = []
    with pytest.raises(CorruptFragment) as err:
        async for chunk in client.read("test/raw", 0, direct=True):
            got.append(chunk)
    assert infos[1].fragment.path in str(err.value)
    assert joined(got) == parts[0]  # the good fragment, none of the corrupt one


async def test_direct_reads_from_s3_by_presigned_url(
        broker: BrokerServer, client: JournalClient, s3_bucket: S3Bucket,
        monkeypatch: pytest.MonkeyPatch) -> None:
    s3_bucket.server.export_env(monkeypatch)  # the in-process broker's S3 store
    monkeypatch.setattr(fetch, "MEMORY_LIMIT", 64 << 10)  # spill to the temp file too
    await broker.apply_yaml(f"""
name: s3/journal
replication: 1
fragment: {{compression_codec: GZIP, stores: ["{s3_bucket.url}frags/"]}}
""")
    parts = [b'{"n": %d, "pad": "%s"}\n' % (i, b"y" * 100) * 2000 for i in range(3)]
    await persist(broker, client, "s3/journal", parts)
    infos = await client.list_fragments("s3/journal", signature_ttl=timedelta(minutes=5))
    assert all(i.signed_url.startswith("http://") for i in infos)
    from_store = READ_BYTES.labels("store")._value.get()
    assert joined(await read_all(client, "s3/journal", 10, direct=True)) \
        == b"".join(parts)[10:]
    assert READ_BYTES.labels("store")._value.get() - from_store == sum(map(len, parts)) - 10

    # A corrupt object in the bucket is refused, nothing of it served.
    s3 = s3_bucket.server.client()
    try:
        key = "frags/" + infos[0].fragment.path
        s3.put_object(Bucket=s3_bucket.name, Key=key, Body=b"not gzip at all")
    finally:
        s3.close()
    with pytest.raises(CorruptFragment):
        async for _ in client.read("s3/journal", 0, direct=True):
            raise AssertionError("corrupt content was served")
