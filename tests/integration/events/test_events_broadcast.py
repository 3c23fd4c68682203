"""A broadcast reader that restarts (its read failed) on a real broker: what a
transactional producer had pending before the restart is delivered when its ACK comes,
and nothing delivered before the restart is delivered again."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from gazette.client import AppendQueue, JournalClient
from gazette.events import Event, Kind, Topic
from gazette.events.broadcast import Broadcaster
from gazette.events.catalog import Catalog, to_journal
from gazette.events.handlers import Handler
from gazette.message import Publisher
from gazette_broker import BrokerServer
from tests.fixtures.abandoned import flaky_reads
from tests.fixtures.events import Order
from tests.fixtures.polling import eventually
from tests.fixtures.relay import Relay

pytestmark = pytest.mark.integration

NEWS = Topic("news", Order, partitions=1)
PART = "events/news/part-000"


@dataclass
class Setup:
    """A subscription whose reader reads through `relay` (cut it: the read fails and
    the reader starts again), a transactional producer `txn` and a committed one
    `committed`, both appending straight to the broker."""

    relay: Relay
    queue: AppendQueue
    txn: Publisher
    committed: Publisher
    seen: list[str] = field(default_factory=list)

    def pending(self, *ids: str) -> None:
        for i in ids:
            self.txn.publish_uncommitted(to_journal(PART), NEWS.new_line(
                Order(id=0, customer="c"), event_id=i))

    async def acknowledge(self) -> None:
        for intent in self.txn.build_ack_intents():
            await self.queue.append(intent.journal, intent.data)

    async def publish(self, *ids: str) -> None:
        for i in ids:
            await self.committed.publish_committed(to_journal(PART), NEWS.new_line(
                Order(id=0, customer="c"), event_id=i))

    async def delivered(self, last: str) -> None:
        await eventually(lambda: last in self.seen, f"{last} is delivered", timeout=30)

    async def restart_reader(self) -> None:
        """Cut the reader's read; return once it reads again."""
        before = self.relay.connections
        self.relay.cut()
        await eventually(lambda: self.relay.connections > before, "the reader reads again",
                         timeout=30)


@pytest.fixture
async def setup(broker_server: BrokerServer) -> AsyncIterator[Setup]:
    async with JournalClient(broker_server.grpc_address) as client, \
            flaky_reads(broker_server.grpc_address) as (relay, flaky), \
            AppendQueue(client) as queue:
        await Catalog(client).partitions(NEWS)  # makes the topic's journal
        broadcaster = Broadcaster(flaky, Catalog(flaky))
        it = Setup(relay, queue, Publisher(queue), Publisher(queue))

        async def handle(event: Event[Order]) -> None:
            it.seen.append(event.id)

        try:
            await broadcaster.subscribe(NEWS, Handler("h", NEWS, handle, Kind.BROADCAST))
            yield it
        finally:
            with contextlib.suppress(Exception):
                await broadcaster.close()


async def test_pending_messages_before_a_restart_are_delivered_at_their_ack(
        setup: Setup) -> None:
    setup.pending("p1", "p2")
    await setup.publish("q1", "q2")  # the reader's position moves past p1 and p2
    await setup.delivered("q2")
    await setup.restart_reader()
    await setup.acknowledge()
    await setup.publish("q3")
    await setup.delivered("q3")
    assert setup.seen == ["q1", "q2", "p1", "p2", "q3"]


async def test_an_ack_of_older_messages_does_not_move_a_restart_back(setup: Setup) -> None:
    setup.pending("p1", "p2")
    await setup.publish("q1", "q2")
    await setup.acknowledge()  # delivers p1 and p2, read before q1 and q2
    await setup.delivered("p2")
    await setup.restart_reader()
    await setup.publish("q3")
    await setup.delivered("q3")
    assert setup.seen == ["q1", "q2", "p1", "p2", "q3"]
