"""A shard's transactions over a real broker: read-committed input (duplicates, rolled
back and uncommitted messages never reach the app), effects in the store and published
outputs exactly once across crashes and restarts and when one application object runs a
shard again after a failed read abandoned its transaction, checkpoints in a JSON file that
survive the process, and transactions sized by the input's rate."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gazette.client import AppendQueue, JournalClient
from gazette.consumer.runner import ShardRunner, SourceError
from gazette.consumer.store import JSONFileStore, MemoryStore
from gazette.message import (
    Envelope,
    JsonMessage,
    Publisher,
)
from gazette.protocol import ShardSource, ShardSpec
from gazette_broker import BrokerServer
from tests.fixtures.abandoned import HELD_OPEN, flaky_reads, read_fails_mid_txn
from tests.fixtures.consumer import (
    KEYS,
    Sums,
    committed_outputs,
    crash_runs,
    produce,
    run_until,
    spec,
    to,
)
from tests.fixtures.polling import eventually

pytestmark = pytest.mark.integration

async def test_effects_and_outputs_exactly_once_across_crashes(
        sums_client: JournalClient) -> None:
    # A MemoryStore's restore drops what was not committed.
    await exactly_once_through_crashes(sums_client, MemoryStore(), random.Random(7))


async def exactly_once_through_crashes(sums_client: JournalClient, store: MemoryStore,
                                       rng: random.Random) -> None:
    """Crashed runs, then one to the end: effects and outputs each exactly once."""
    async with AppendQueue(sums_client) as out:
        expected = await crash_runs(sums_client, out, lambda: Sums(store), rng, 4)
        await run_until(ShardRunner(spec(), Sums(store), sums_client, out), sums_client)
        await out.flush()
    assert store.committed == expected
    assert await committed_outputs(sums_client) == expected


class PipelinedStore(MemoryStore):
    """Commits that take a while, several under way at once, landing in order (as
    `SQLiteStore`'s on its recovery log)."""

    commits_in_flight = 3

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        self.rng = rng
        self.most_under_way = 0
        self._under_way: list[asyncio.Future[None]] = []

    async def restore_checkpoint(self) -> Any:
        self._under_way = []  # (a crashed run's commits are gone with it)
        return await super().restore_checkpoint()

    def start_commit(self, checkpoint: Any, wait_for: Any) -> asyncio.Future[None]:
        snapshot, before = dict(self.state), list(self._under_way)

        async def commit() -> None:
            await asyncio.gather(*wait_for)
            await asyncio.sleep(self.rng.uniform(0, 0.02))
            for earlier in before:
                await earlier
            self.committed, self.checkpoint = snapshot, checkpoint
            self.commits += 1

        fut = asyncio.ensure_future(commit())
        self._under_way = [f for f in self._under_way if not f.done()] + [fut]
        self.most_under_way = max(self.most_under_way, len(self._under_way))
        return fut


async def test_exactly_once_with_several_commits_under_way(
        sums_client: JournalClient) -> None:
    # The checkpoint of a transaction carries the ACK intents of the commits still
    # under way before it, and each one's held appends go after its own ACKs: crashes
    # at any point leave effects and outputs exactly once.
    rng = random.Random(11)
    store = PipelinedStore(rng)
    await exactly_once_through_crashes(sums_client, store, rng)
    assert store.most_under_way > 1


async def test_a_transaction_abandoned_by_a_failed_read_leaves_nothing_to_the_next(
        broker_server: BrokerServer, sums_client: JournalClient) -> None:
    """`shard.txn` is the transaction's own: one application object runs the shard
    again after a run whose open transaction was abandoned, and publishes once."""
    expected = await produce(sums_client, random.Random(3), 20)
    store = MemoryStore()
    app = Sums(store)
    async with AppendQueue(sums_client) as out, \
            flaky_reads(broker_server.grpc_address) as (relay, flaky):
        await read_fails_mid_txn(ShardRunner(spec(**HELD_OPEN), app, flaky, out), relay,
                                 lambda: app.consumed > 0)
        await run_until(ShardRunner(spec(), app, sums_client, out), sums_client)
        await out.flush()
    assert store.committed == expected
    assert await committed_outputs(sums_client) == expected


async def test_a_json_file_store_survives_the_process(sums_client: JournalClient,
                                                      tmp_path: Path) -> None:
    rng = random.Random(11)
    expected = await produce(sums_client, rng, 40)
    path = tmp_path / "shard-0.json"
    async with AppendQueue(sums_client) as out:
        await run_until(ShardRunner(spec(), Sums(lambda: JSONFileStore(path)), sums_client, out),
                        sums_client)
        more = await produce(sums_client, rng, 40)
        await run_until(ShardRunner(spec(), Sums(lambda: JSONFileStore(path)), sums_client, out),
                        sums_client)
        await out.flush()
    store = JSONFileStore(path)
    await store.restore_checkpoint()
    assert store.state == {k: expected[k] + more[k] for k in KEYS}
    assert await committed_outputs(sums_client) == store.state


async def test_transactions_grow_with_the_rate(sums_client: JournalClient) -> None:
    store = MemoryStore()
    async with AppendQueue(sums_client) as queue, AppendQueue(sums_client) as out:
        publisher = Publisher(queue)
        for i in range(2000):  # a backlog: read in big transactions
            publisher.publish_committed(to("sums/input"), JsonMessage(key="a", n=i))
        await queue.flush()
        runner = ShardRunner(spec(), Sums(store), sums_client, out)
        await run_until(runner, sums_client)
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


async def test_a_missing_source_journal_is_named(sums_client: JournalClient) -> None:
    bad = ShardSpec("sums/shard-x", (ShardSource("sums/nope"),))
    async with AppendQueue(sums_client) as out:
        with pytest.raises(SourceError, match="shard sums/shard-x: source journal "
                                              "sums/nope does not exist"):
            await ShardRunner(bad, Sums(MemoryStore()), sums_client, out).run()


async def test_an_application_can_filter_its_source(sums_client: JournalClient) -> None:
    """`read_source` (Gazette's MessageProducer): the app drops messages of key "b" before
    they reach it; the checkpoint still reads through every byte."""
    class NoB(Sums):
        async def read_source(self, shard: Any, journal: str, offset: int,
                              batches: AsyncIterator[list[Envelope]]
                              ) -> AsyncIterator[list[Envelope]]:
            async for batch in batches:
                yield [e for e in batch if e.message.get("key") != "b"]

    store = MemoryStore()
    async with AppendQueue(sums_client) as out:
        publisher = Publisher(out)
        for key in ("a", "b", "a", "b", "c"):
            publisher.publish_committed(to("sums/input"), JsonMessage(key=key, n=1))
        await out.flush()
        runner = ShardRunner(spec(), NoB(store), sums_client, out)
        await run_until(runner, sums_client)
    assert store.committed == {"a": 2, "c": 1}
    assert runner.shard.progress.committed["sums/input"] == \
        await sums_client.write_head("sums/input")
