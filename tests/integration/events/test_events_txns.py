"""Events groups' transactions on a real broker, etcd and PostgreSQL: a transaction
abandoned by a failed read is not handled twice when the shard runs again; an event id
twice in one batch runs once; a handler that reads a total and writes it back loses no
update while events stream in (each transaction begins once the last one committed)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from gazette.client import AppendQueue, JournalClient
from gazette.consumer import Shard, ShardRunner
from gazette.events import Event, Events, Kind, OnFailure, Topic
from gazette.events.catalog import Catalog
from gazette.events.group import Group, GroupApp
from gazette.events.handlers import Handler
from gazette.message import Envelope, Publisher
from gazette.protocol import ShardSource, ShardSpec
from gazette_broker import BrokerServer
from tests.fixtures.abandoned import (
    HELD_OPEN,
    flaky_reads,
    read_fails_mid_txn,
    run_through,
)
from tests.fixtures.etcd import EtcdServer
from tests.fixtures.events import (
    Order,
    committed_lines,
    new_events,
    processed,
    set_group_shard,
)
from tests.fixtures.polling import eventually
from tests.fixtures.postgres import PgDatabase

pytestmark = pytest.mark.integration

CLICKS = Topic("clicks", Order, partitions=1)
PART, RETRIES = "events/clicks/part-000", "events/clicks/retry/g"


@pytest.fixture
async def client(broker_server: BrokerServer) -> AsyncIterator[JournalClient]:
    async with JournalClient(broker_server.grpc_address) as c:
        yield c


class Watched(GroupApp):
    """The group's application, counting the messages its transactions consumed."""

    consumed = 0

    def consume_message(self, shard: Shard, store: Any, envelope: Envelope,
                        publisher: Publisher) -> None:
        self.consumed += 1
        super().consume_message(shard, store, envelope, publisher)


async def test_a_transaction_abandoned_by_a_failed_read_is_handled_once(
        broker_server: BrokerServer, etcd_server: EtcdServer, consumer_root: str,
        pg_database: PgDatabase, client: JournalClient) -> None:
    seen: list[int] = []

    async def count(event: Event[Order]) -> None:
        seen.append(event.payload.id)

    async def flaky(event: Event[Order]) -> None:
        if event.payload.id % 5 == 0:
            raise RuntimeError("not now")

    group = Group("g")
    group.add(Handler("count", CLICKS, count, Kind.IDEMPOTENT))
    group.add(Handler("flaky", CLICKS, flaky, Kind.IDEMPOTENT,
                      on_failure=OnFailure.RETRY_LATER))
    app = Watched(group, dsn=pg_database.dsn, prefix="events/")
    producer: Events = new_events(broker_server, etcd_server, consumer_root)
    async with producer, flaky_reads(broker_server.grpc_address) as (relay, flaky_client), \
            AppendQueue(client) as out:
        await producer.catalog.ensure_group(CLICKS, "g")
        await producer.produce(CLICKS, *[Order(id=i, customer="c") for i in range(10)])
        source = (ShardSource(PART),)
        await read_fails_mid_txn(
            ShardRunner(ShardSpec("clicks/part-000", source, **HELD_OPEN), app, flaky_client,
                        out), relay, lambda: app.consumed == 10)
        # The shard runs again here (as its member runs it after a transient failure).
        await run_through(ShardRunner(ShardSpec("clicks/part-000", source), app, client, out),
                          client, [PART])
    assert sorted(seen) == list(range(10)), "events handled twice (or not at all)"
    retried = [r["data"]["id"] for r in await committed_lines(client, RETRIES)]
    assert sorted(retried) == [0, 5], "failures routed twice to the retry journal"


async def test_an_event_id_twice_in_one_batch_runs_once(
        broker_server: BrokerServer, etcd_server: EtcdServer, consumer_root: str,
        pg_database: PgDatabase) -> None:
    calls: list[list[str]] = []

    async def apply(tx: Any, batch: list[Event[Order]]) -> None:
        calls.append([e.id for e in batch])
        await tx.execute("INSERT INTO effects SELECT unnest(%s::text[])", ([e.id for e in batch],))

    async with await psycopg.AsyncConnection.connect(pg_database.dsn, autocommit=True) as c:
        await c.execute("CREATE TABLE effects (event_id TEXT NOT NULL)")
    ids = ["a", "b", "a", "c", "b", "a"]  # re-produced with the same ids, one append
    producer = new_events(broker_server, etcd_server, consumer_root)
    async with producer:
        await producer.produce(CLICKS, *[Order(id=i, customer="c") for i in range(6)],
                               event_ids=ids)
    events = new_events(broker_server, etcd_server, consumer_root, dsn=pg_database.dsn)
    events.exactly_once("dups", CLICKS, apply, batch_size=10)
    async with events:  # every event is there already: one transaction, one batch
        await events.produce(CLICKS, Order(id=9, customer="c"), event_ids=["last"])
        async def last_committed() -> bool:  # (and, in its partition, all before it)
            return await processed(pg_database.dsn, "dups", "apply") >= 4
        await eventually(last_committed, "the last event committed", timeout=30)
    # Each id's first copy, in order (one partition).
    assert [i for c in calls for i in c] == ["a", "b", "c", "last"]
    async with await psycopg.AsyncConnection.connect(pg_database.dsn) as c:
        cur = await c.execute("SELECT event_id, count(*) FROM effects GROUP BY event_id")
        assert dict(await cur.fetchall()) == {"a": 1, "b": 1, "c": 1, "last": 1}


async def test_a_read_modify_write_handler_keeps_exact_totals_under_load(
        broker_server: BrokerServer, etcd_server: EtcdServer, consumer_root: str,
        pg_database: PgDatabase, client: JournalClient) -> None:
    async with await psycopg.AsyncConnection.connect(pg_database.dsn, autocommit=True) as c:
        await c.execute("CREATE TABLE totals (customer TEXT PRIMARY KEY, cents BIGINT)")
    async def add(tx: Any, event: Event[Order]) -> None:
        cur = await tx.execute("SELECT cents FROM totals WHERE customer = %s",
                               (event.payload.customer,))
        row = await cur.fetchone()
        cents = (row[0] if row else 0) + event.payload.amount
        await tx.execute("INSERT INTO totals VALUES (%s, %s) ON CONFLICT (customer) DO "
                         "UPDATE SET cents = excluded.cents", (event.payload.customer, cents))

    # Under load, short transactions: each closes while the one before may still commit.
    await Catalog(client).partitions(CLICKS)  # the topic's journal, for the shard
    await set_group_shard(etcd_server.endpoint, consumer_root, "ledger", ShardSpec(
        "clicks/part-000", (ShardSource(PART),), max_txn_duration=timedelta(milliseconds=1)))

    async def audit(event: Event[Order]) -> None:
        if event.payload.id % 10 == 0 and not event.attempt:
            raise RuntimeError("later")  # a commit waits for its retries' appends

    events = new_events(broker_server, etcd_server, consumer_root, dsn=pg_database.dsn)
    events.exactly_once("ledger", CLICKS, add)
    events.idempotent("ledger", CLICKS, audit, on_failure=OnFailure.RETRY_LATER)
    expected: dict[str, int] = {}
    async with events:
        for burst in range(40):  # a stream: transactions close and begin under load
            orders = [Order(id=i, customer=f"c{i % 3}", amount=burst + 1) for i in range(50)]
            for o in orders:
                expected[o.customer] = expected.get(o.customer, 0) + o.amount
            await events.produce(CLICKS, *orders)

        async def committed() -> bool:
            return await processed(pg_database.dsn, "ledger", "add") == 2000
        await eventually(committed, "every event's transaction committed", timeout=60)
    async with await psycopg.AsyncConnection.connect(pg_database.dsn) as c:
        cur = await c.execute("SELECT customer, cents FROM totals")
        assert dict(await cur.fetchall()) == expected
