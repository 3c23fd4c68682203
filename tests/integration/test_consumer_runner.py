"""A shard's transactions over a real broker: read-committed input (duplicates, rolled
back and uncommitted messages never reach the app), effects in the store and published
outputs exactly once across crashes and restarts, checkpoints in a JSON file that survive
the process, and transactions sized by the input's rate."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gazette.client import AppendQueue, JournalClient
from gazette.consumer.app import Application, Shard
from gazette.consumer.runner import ShardRunner, SourceError
from gazette.consumer.store import JSONFileStore, MemoryStore
from gazette.message import (
    Envelope,
    JsonMessage,
    Partition,
    Publisher,
    Sequencer,
    drain,
    framing_for,
    read_uncommitted,
)
from gazette.protocol import ShardSource, ShardSpec
from gazette_broker import BrokerServer
from tests.fixtures.polling import eventually

pytestmark = pytest.mark.integration

NDJSON = "application/x-ndjson"
SPECS = """
name: sums/
replication: 1
labels: [{name: content-type, value: application/x-ndjson}]
fragment:
  stores: ["file:///"]
children:
  - name: sums/input
  - name: sums/output
"""
KEYS = ["a", "b", "c", "d"]


def to(journal: str) -> Any:
    part = Partition(journal, NDJSON)
    return lambda msg: part


class Sums(Application):
    """Adds each message's ``n`` to its key's total; at each transaction's close,
    publishes what it added per key (so the outputs sum to the totals, exactly once)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.txn: dict[str, int] = {}

    def new_store(self, shard: Shard) -> Any:
        return self.store() if callable(self.store) else self.store

    def consume_message(self, shard: Shard, store: Any, envelope: Envelope,
                        publisher: Publisher) -> None:
        key, n = envelope.message["key"], envelope.message["n"]
        store.state[key] = store.state.get(key, 0) + n
        self.txn[key] = self.txn.get(key, 0) + n

    def finalize_txn(self, shard: Shard, store: Any, publisher: Publisher) -> None:
        for key, delta in self.txn.items():
            publisher.publish_uncommitted(to("sums/output"),
                                          JsonMessage(key=key, delta=delta))
        self.txn = {}


@pytest.fixture
async def client(broker_server: BrokerServer) -> AsyncIterator[JournalClient]:
    await broker_server.apply_yaml(SPECS)
    async with JournalClient(broker_server.grpc_address) as c:
        yield c


def spec(**kw: Any) -> ShardSpec:
    return ShardSpec("sums/shard-0", (ShardSource("sums/input"),), **kw)


async def produce(client: JournalClient, rng: random.Random, rounds: int) -> dict[str, int]:
    """Input of every kind: committed outside transactions, transactions committed,
    a transaction rolled back (its producer re-acknowledges an earlier point), and
    appends sent twice. Returns the totals a correct consumer must reach."""
    expected = dict.fromkeys(KEYS, 0)
    last_acks: list[Any] = []
    async with AppendQueue(client) as queue:
        publisher = Publisher(queue)

        async def append(intents: list[Any]) -> None:
            await asyncio.gather(*(queue.append(x.journal, x.data) for x in intents))

        for i in range(rounds):
            key, n = rng.choice(KEYS), rng.randrange(1, 100)
            kind = i % 4
            if kind == 0:  # committed at once
                await publisher.publish_committed(to("sums/input"), JsonMessage(key=key, n=n))
                expected[key] += n
            elif kind == 1:  # a committed transaction of three
                for _ in range(3):
                    await publisher.publish_uncommitted(to("sums/input"),
                                                        JsonMessage(key=key, n=n))
                    expected[key] += n
                last_acks = publisher.build_ack_intents()
                await append(last_acks)
            elif kind == 2:  # rolled back: the producer "restarts" from its last ACK
                await publisher.publish_uncommitted(to("sums/input"),
                                                    JsonMessage(key=key, n=1000))
                publisher.build_ack_intents()  # the lost transaction's, never written
                await append(last_acks)  # the recovered checkpoint's ACK, again
            else:  # sent twice: the second is a duplicate
                msg = JsonMessage(key=key, n=n)
                await publisher.publish_committed(to("sums/input"), msg)
                await queue.append("sums/input", framing_for(NDJSON).encode((msg,)))
                expected[key] += n
    return expected


async def committed_outputs(client: JournalClient) -> dict[str, int]:
    """The per-key sums of sums/output's read-committed messages."""
    head = await client.write_head("sums/output")
    sequencer = Sequencer()
    framing = framing_for(NDJSON)

    async def chunks() -> AsyncIterator[bytes]:
        async for c in client.read("sums/output", 0, end_offset=head):
            yield c.content

    async def replay(journal: str, begin: int, end: int) -> AsyncIterator[list[Envelope]]:
        async def part() -> AsyncIterator[bytes]:
            async for c in client.read(journal, begin, end_offset=end):
                yield c.content
        async for batch in read_uncommitted(journal, part(), framing, begin):
            yield batch

    sums = dict.fromkeys(KEYS, 0)
    async for batch in read_uncommitted("sums/output", chunks(), framing, 0):
        sequencer.queue_all(batch)
        for env in await drain(sequencer, replay):
            sums[env.message["key"]] += env.message["delta"]
    return sums


async def run_until(runner: ShardRunner, client: JournalClient, timeout: float = 30
                    ) -> None:
    """Run `runner` until its shard has committed through sums/input's write head."""
    head = await client.write_head("sums/input")
    task = asyncio.create_task(runner.run())
    try:
        async with asyncio.timeout(timeout):
            done = asyncio.ensure_future(runner.shard.progress.wait_committed(
                {"sums/input": head}))
            await asyncio.wait({task, done}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                done.cancel()
                task.result()  # raises what failed it
            assert done.done()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def caught_up(runner: ShardRunner, client: JournalClient) -> bool:
    head = await client.write_head("sums/input")
    return runner.shard.progress.committed.get("sums/input", 0) >= head


async def test_effects_and_outputs_exactly_once_across_crashes(
        client: JournalClient) -> None:
    rng = random.Random(7)
    expected = dict.fromkeys(KEYS, 0)
    store = MemoryStore()
    async with AppendQueue(client) as out:
        # Crashes: each run is cancelled once it has committed twice, while input keeps
        # coming; each new run starts from the store's last commit (a MemoryStore's
        # restore drops what was not committed).
        for _ in range(4):
            producing = asyncio.create_task(produce(client, rng, 60))
            runner = ShardRunner(spec(), Sums(store), client, out)
            task = asyncio.create_task(runner.run())
            await eventually(lambda r=runner, t=task, p=producing:
                             r.shard.progress.transactions >= 2 or t.done() or p.done(),
                             "two transactions commit", timeout=20)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            for key, n in (await producing).items():
                expected[key] += n
        await run_until(ShardRunner(spec(), Sums(store), client, out), client)
        await out.flush()
    assert store.committed == expected
    assert await committed_outputs(client) == expected


async def test_a_json_file_store_survives_the_process(client: JournalClient,
                                                      tmp_path: Path) -> None:
    rng = random.Random(11)
    expected = await produce(client, rng, 40)
    path = tmp_path / "shard-0.json"
    async with AppendQueue(client) as out:
        await run_until(ShardRunner(spec(), Sums(lambda: JSONFileStore(path)), client, out),
                        client)
        more = await produce(client, rng, 40)
        await run_until(ShardRunner(spec(), Sums(lambda: JSONFileStore(path)), client, out),
                        client)
        await out.flush()
    store = JSONFileStore(path)
    await store.restore_checkpoint()
    assert store.state == {k: expected[k] + more[k] for k in KEYS}
    assert await committed_outputs(client) == store.state


async def test_transactions_grow_with_the_rate(client: JournalClient) -> None:
    store = MemoryStore()
    async with AppendQueue(client) as queue, AppendQueue(client) as out:
        publisher = Publisher(queue)
        for i in range(2000):  # a backlog: read in big transactions
            publisher.publish_committed(to("sums/input"), JsonMessage(key="a", n=i))
        await queue.flush()
        runner = ShardRunner(spec(), Sums(store), client, out)
        await run_until(runner, client)
        backlog_txns = runner.shard.progress.transactions
        assert store.committed["a"] == sum(range(2000))
        assert backlog_txns < 200, backlog_txns  # many messages per transaction
        # At a trickle, each message is its own transaction: none waits for another.
        task = asyncio.create_task(runner.run())
        try:
            for i in range(5):
                before = runner.shard.progress.transactions
                await publisher.publish_committed(to("sums/input"),
                                                  JsonMessage(key="b", n=1))
                await eventually(lambda b=before: runner.shard.progress.transactions > b,
                                 f"message {i} commits on its own")
                assert runner.shard.progress.transactions == before + 1
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert store.committed["b"] == 5


async def test_a_missing_source_journal_is_named(client: JournalClient) -> None:
    bad = ShardSpec("sums/shard-x", (ShardSource("sums/nope"),))
    async with AppendQueue(client) as out:
        with pytest.raises(SourceError, match="shard sums/shard-x: source journal "
                                              "sums/nope does not exist"):
            await ShardRunner(bad, Sums(MemoryStore()), client, out).run()
