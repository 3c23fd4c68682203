"""A shard's checkpoint forgets producers silent for long (Gazette's prune horizon):
upstream publishers restart 10,000 times, each with a new producer id, and the
checkpoint stays as small as the producers of the last day make it, while every
committed message is consumed once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any

import pytest

from gazette.client import AppendQueue, JournalClient
from gazette.consumer import Application, Checkpoint, Shard, ShardRunner
from gazette.consumer.store import MemoryStore
from gazette.message import (
    PRUNE_HORIZON,
    Clock,
    Envelope,
    JsonMessage,
    ProducerState,
    Publisher,
    framing_for,
)
from tests.fixtures.consumer import NDJSON, spec, to

pytestmark = pytest.mark.integration

RESTARTS = 10_000
#: A publisher's lifetime: each one after the last starts an hour later.
LIFETIME = 3600.0
T0 = 1_700_000_000.0
ROUND = 100


class SizedStore(MemoryStore):
    """A MemoryStore that notes the size of each checkpoint it commits."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def start_commit(self, checkpoint: Checkpoint, wait_for: Sequence[Awaitable[Any]]
                     ) -> asyncio.Future[None]:
        self.sizes.append(len(checkpoint.encode()))
        return super().start_commit(checkpoint, wait_for)


class Count(Application):
    def __init__(self, store: SizedStore) -> None:
        self.store = store

    def new_store(self, shard: Shard) -> Any:
        return self.store

    def consume_message(self, shard: Shard, store: Any, envelope: Envelope,
                        publisher: Publisher) -> None:
        store.state["n"] = store.state.get("n", 0) + envelope.message["n"]


async def test_a_checkpoint_stays_bounded_across_10000_producer_restarts(
        sums_client: JournalClient) -> None:
    store = SizedStore()
    async with AppendQueue(sums_client) as queue:
        runner = ShardRunner(spec(), Count(store), sums_client, queue)
        running = asyncio.create_task(runner.run())
        try:
            for i in range(RESTARTS):  # each publisher is a restart of the last one
                publisher = Publisher(queue, Clock(Clock.from_unix(T0 + i * LIFETIME)))
                last = JsonMessage(n=1)
                publisher.publish_committed(to("sums/input"), last)
                if i % 10 == 0:  # it died in a transaction it never committed
                    publisher.publish_uncommitted(to("sums/input"), JsonMessage(n=1000))
                if i % ROUND == ROUND - 1:  # a checkpoint every so many restarts
                    await queue.flush()
                    head = await sums_client.write_head("sums/input")
                    await asyncio.wait_for(runner.shard.progress.wait_committed(
                        {"sums/input": head}), 30)
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)

    assert store.committed == {"n": RESTARTS}, "each committed message once"
    # The producers of the last day (the horizon), and their pending transactions.
    last_day = int(PRUNE_HORIZON / LIFETIME) + 1
    producers = store.checkpoint.producers
    assert len(producers) <= last_day, f"{len(producers)} producers in the checkpoint"
    assert {p.begin >= 0 for p in producers} == {True, False}, \
        "pending producers of the last day are kept"
    assert len(store.sizes) >= RESTARTS // ROUND, "checkpoints all along"
    biggest = Checkpoint({"sums/input": 1 << 40}, [
        ProducerState("sums/input", (1 << 48) - 1 - i, 1 << 62, 1 << 40, (1 << 62) + 1)
        for i in range(last_day)]).encode()
    assert max(store.sizes) <= len(biggest), \
        f"checkpoint sizes grew: {store.sizes[::max(1, len(store.sizes) // 20)]}"

    # Restored from that checkpoint, the shard goes on from the pruned states: a
    # producer of the last day is still known (its message sent again is a duplicate).
    async with AppendQueue(sums_client) as queue:
        queue.append("sums/input", framing_for(NDJSON).encode((last,)))
        Publisher(queue, Clock(Clock.from_unix(T0 + RESTARTS * LIFETIME))) \
            .publish_committed(to("sums/input"), JsonMessage(n=1))
        await queue.flush()
        runner = ShardRunner(spec(), Count(store), sums_client, queue)
        running = asyncio.create_task(runner.run())
        try:
            head = await sums_client.write_head("sums/input")
            await asyncio.wait_for(runner.shard.progress.wait_committed(
                {"sums/input": head}), 30)
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
    assert store.committed == {"n": RESTARTS + 1}
