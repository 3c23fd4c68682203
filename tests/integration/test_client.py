"""The journal client against a real broker: appends (safe retries), following reads
that resume after cut connections, direct fragment reads, listings, spec changes, the
AppendQueue, and the message Publisher over it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from gazette.client import (
    AppendQueue,
    AppendUncertain,
    ApplyConflict,
    BrokerError,
    JournalClient,
    RetryPolicy,
)
from gazette.errors import ValidationError
from gazette.fragment import CorruptFragment
from gazette.labels import LabelSet, Selector
from gazette.local.tutorial import FOOBAR_TREE_YAML, TUTORIAL_JOURNALS_YAML
from gazette.message import JsonMessage, Publisher, Sequencer, framing_for
from gazette.message.mapping import StaticPartitions, modulo_mapping
from gazette.message.reader import read_committed, read_uncommitted
from gazette.protocol.trees import SpecChange, journal_changes_from_yaml
from gazette_broker.server import BrokerServer

pytestmark = pytest.mark.integration

JOURNAL = "example/journal"


class Relay:
    """A TCP relay between client and broker whose connections a test can cut."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(1 << 16):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self) -> None:
        for w in self.writers:
            w.transport.abort()
        self.writers.clear()

    async def close(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()


@pytest.fixture
async def client(broker_server: BrokerServer) -> AsyncIterator[JournalClient]:
    await broker_server.apply_yaml(TUTORIAL_JOURNALS_YAML)
    async with JournalClient(f"http://{broker_server.grpc_address}") as c:
        yield c


async def read_all(client: JournalClient, journal: str = JOURNAL, offset: int = 0,
                   **kw: bool) -> bytes:
    return b"".join([c.content async for c in client.read(journal, offset, **kw)])


async def test_appends_and_reads(client: JournalClient) -> None:
    r1 = await client.append(JOURNAL, b'{"Msg": "Hello, Gazette!"}\n')
    assert (r1.commit.begin, r1.commit.end) == (0, 27)
    await client.append(JOURNAL, [b"a", b"b\n"])

    async def parts() -> AsyncIterator[bytes]:
        yield b"c"
        yield b"d\n"

    await client.append(JOURNAL, parts())
    assert await read_all(client) == b'{"Msg": "Hello, Gazette!"}\nab\ncd\n'
    assert await read_all(client, offset=16) == b'Gazette!"}\nab\ncd\n'
    assert await client.write_head(JOURNAL) == 33
    assert await read_all(client, offset=-1) == b""  # at the head: nothing yet

    with pytest.raises(BrokerError, match="WRONG_APPEND_OFFSET"):
        await client.append(JOURNAL, b"x\n", offset=5)
    ok = await client.append(JOURNAL, b"x\n", offset=33)
    assert ok.commit.begin == 33
    with pytest.raises(BrokerError, match="JOURNAL_NOT_FOUND"):
        await client.append("no/such", b"x\n")
    with pytest.raises(ValidationError, match="journal"):
        await client.append("bad name", b"x\n")


async def test_registers_fence_writers(client: JournalClient) -> None:
    owner = LabelSet.from_list([{"name": "owner", "value": "a"}])
    r = await client.append(JOURNAL, b"1\n", union_registers=owner)
    assert r.registers == owner
    with pytest.raises(BrokerError, match="REGISTER_MISMATCH"):
        await client.append(JOURNAL, b"2\n", check_registers=Selector.parse("owner=b"))
    await client.append(JOURNAL, b"3\n", check_registers=Selector.parse("owner=a"))
    assert await read_all(client) == b"1\n3\n"


async def test_a_blocking_reader_follows_the_head(client: JournalClient) -> None:
    got: list[bytes] = []

    async def follow() -> None:
        async for chunk in client.read(JOURNAL, 0, block=True):
            got.append(chunk.content)
            if b"".join(got).count(b"\n") == 3:
                return

    task = asyncio.create_task(follow())
    for line in (b"one\n", b"two\n", b"three\n"):
        await client.append(JOURNAL, line)
    await asyncio.wait_for(task, 10)
    assert b"".join(got) == b"one\ntwo\nthree\n"


async def test_cut_connections_resume_reads_and_retry_appends_once(
    broker_server: BrokerServer, client: JournalClient,
) -> None:
    relay = Relay(int(broker_server.grpc_address.rsplit(":", 1)[1]))
    await relay.start()
    try:
        async with JournalClient(f"127.0.0.1:{relay.port}",
                                 retry=RetryPolicy(attempts=20, initial=0.02)) as cut:
            lines = [b"line %03d\n" % i for i in range(60)]
            got: list[bytes] = []

            async def follow() -> None:
                async for chunk in cut.read(JOURNAL, 0, block=True):
                    got.append(chunk.content)
                    if sum(map(len, got)) == sum(map(len, lines)):
                        return

            task = asyncio.create_task(follow())
            for i, line in enumerate(lines):
                await client.append(JOURNAL, line)
                if i % 15 == 7:
                    await asyncio.sleep(0.05)  # let the reader get some, then cut it
                    relay.cut()
            await asyncio.wait_for(task, 20)
            assert b"".join(got) == b"".join(lines)  # no byte twice, none skipped

            # An append cut before its commit is retried: it lands exactly once.
            head = await client.write_head(JOURNAL)

            async def slow() -> AsyncIterator[bytes]:
                yield b"streamed "
                relay.cut()
                await asyncio.sleep(0.1)
                yield b"append\n"

            with pytest.raises(Exception):  # noqa: B017 - a stream cannot replay
                await cut.append(JOURNAL, slow())
            assert await client.write_head(JOURNAL) == head  # nothing of it committed
            r = await cut.append(JOURNAL, [b"retried ", b"append\n"])
            assert await read_all(client, offset=head) == b"retried append\n"
            assert r.commit.begin == head
    finally:
        await relay.close()


async def test_an_uncertain_append_is_resolved_by_its_offset(
    broker_server: BrokerServer, client: JournalClient,
) -> None:
    """The broker commits, but the answer is lost: with an offset, the client checks
    what landed there; without, it says it cannot know."""
    relay = Relay(int(broker_server.grpc_address.rsplit(":", 1)[1]))
    await relay.start()
    replica = broker_server.broker.replicas[JOURNAL]
    original = replica.append

    async def commit_then_cut(*args: object, **kw: object) -> object:
        result = await original(*args, **kw)  # type: ignore[arg-type]
        relay.cut()  # the commit happened; its answer will not arrive
        return result

    try:
        async with JournalClient(f"127.0.0.1:{relay.port}",
                                 retry=RetryPolicy(attempts=10, initial=0.02)) as cut:
            replica.append = commit_then_cut  # type: ignore[method-assign]
            with pytest.raises(AppendUncertain):
                await cut.append(JOURNAL, b"maybe\n")
            head = await client.write_head(JOURNAL)
            result = await cut.append(JOURNAL, b"sure\n", offset=head)
            replica.append = original  # type: ignore[method-assign]
            assert result.commit.begin == head
            assert await read_all(client) == b"maybe\nsure\n"  # once, not twice
    finally:
        replica.append = original  # type: ignore[method-assign]
        await relay.close()


async def test_append_queue_batches_in_call_order(client: JournalClient) -> None:
    queue = AppendQueue(client, max_batch_bytes=1 << 16)
    futures = [queue.append(j, b"%s %04d\n" % (j.encode(), i))
               for i in range(400) for j in (JOURNAL, "foobar/part-000")]
    results = await asyncio.gather(*futures)
    await queue.close()
    distinct = {(r.commit.journal, r.commit.begin) for r in results}
    assert len(distinct) < len(futures) / 4  # many appends shared each RPC
    for j in (JOURNAL, "foobar/part-000"):
        assert await read_all(client, j) == b"".join(b"%s %04d\n" % (j.encode(), i)
                                                      for i in range(400))
    with pytest.raises(RuntimeError):
        queue.append(JOURNAL, b"late\n")


async def test_publisher_over_the_append_queue(client: JournalClient) -> None:
    specs = [c.spec for c in journal_changes_from_yaml(FOOBAR_TREE_YAML) if c.spec]
    queue = AppendQueue(client)
    pub = Publisher(queue)
    mapping = modulo_mapping(lambda m: m["key"].encode(),
                             StaticPartitions(specs, Selector.parse("prefix=foobar/")))
    sent = [JsonMessage(key=f"k{i % 7}", n=i) for i in range(200)]
    await asyncio.gather(*(pub.publish_committed(mapping, m) for m in sent))
    await queue.close()
    seen = []
    for spec in specs:
        async def chunks(name: str = spec.name) -> AsyncIterator[bytes]:
            async for c in client.read(name, 0):
                yield c.content

        async def replay(journal: str, begin: int, end: int):  # type: ignore[no-untyped-def]
            raise AssertionError("no replay expected")
            yield []

        batches = read_uncommitted(spec.name, chunks(), framing_for("application/x-ndjson"))
        async for batch in read_committed(batches, Sequencer(), replay):
            seen += [env.message["n"] for env in batch]
    assert sorted(seen) == list(range(200))


async def test_listing_and_revision_guarded_apply(client: JournalClient) -> None:
    listing = await client.list("prefix=foobar/")
    assert [j.spec.name for j in listing.journals] == [
        "foobar/part-000", "foobar/part-001", "foobar/part-002"]
    assert all(j.route.primary_member for j in listing.journals)
    first = listing.journals[0]
    rev = await client.apply([SpecChange(first.spec.name, first.mod_revision, first.spec)])
    assert rev > first.mod_revision
    with pytest.raises(ApplyConflict):
        await client.apply([SpecChange(first.spec.name, first.mod_revision, first.spec)])
    with pytest.raises(ValidationError):
        await client.list("name in (")

    updates = client.watch("prefix=foobar/")
    assert len((await anext(updates)).journals) == 3
    await client.apply([SpecChange("foobar/part-002",
                                   listing.journals[2].mod_revision, None)])
    assert len((await asyncio.wait_for(anext(updates), 10)).journals) == 2
    await updates.aclose()  # type: ignore[attr-defined]


async def test_fragments_and_direct_reads(broker_server: BrokerServer,
                                          client: JournalClient, tmp_path: Path) -> None:
    replica = broker_server.broker.replicas[JOURNAL]
    content = b""
    for i in range(3):
        line = b'{"n": %d}\n' % i
        await client.append(JOURNAL, line)
        content += line
        await replica.roll()
    await client.append(JOURNAL, b"open\n")
    content += b"open\n"
    await asyncio.wait_for(broker_server.broker.persister.wait_idle(), 10)
    frags = await client.list_fragments(JOURNAL, signature_ttl=timedelta(minutes=1),
                                        page_limit=1)
    assert [f.fragment.begin for f in frags] == [0, 9, 18, 27]
    assert all(f.signed_url for f in frags[:3]) and not frags[3].signed_url
    pages = [len(p) async for p in client.fragments(JOURNAL, page_limit=3)]
    assert pages == [3, 1]

    assert await read_all(client, direct=True) == content
    assert await read_all(client, offset=12, direct=True) == content[12:]

    # A corrupt stored fragment is detected, never served as good.
    path = Path(frags[1].signed_url.removeprefix("file://"))
    stored = await asyncio.to_thread(path.read_bytes)
    await asyncio.to_thread(path.write_bytes, stored[:-3] + b"xyz")
    with pytest.raises(CorruptFragment):
        await read_all(client, offset=9, direct=True)
