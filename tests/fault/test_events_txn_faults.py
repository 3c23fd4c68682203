"""Events' transactions through faults, each checked for exact totals (mutual TLS and
authorization on, as in every fault suite):

- a group's read fails (its broker out of reach until the client's retries are spent)
  while its transaction is open: each event is handled once, each failure routed once;
- event ids re-produced into the same batch while the handling process is SIGKILLed;
- a broadcast subscription fed by transactional producers (some transactions rolled
  back) while its reader's connection is cut again and again;
- a read-modify-write exactly-once handler under short transactions whose commits wait
  for appends that the member's cut connection delays.
"""

from __future__ import annotations

import asyncio
import random
import signal
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client import REGISTRY

from gazette.client import AppendQueue, JournalClient
from gazette.events import Event, Events, Kind, OnFailure, Topic
from gazette.events.broadcast import Broadcaster
from gazette.events.catalog import Catalog, to_journal
from gazette.events.handlers import Handler
from gazette.message import Publisher
from gazette.protocol import ReplicaState, ShardSource, ShardSpec
from tests.fault.events_member import ORDERS
from tests.fault.test_events_faults import effects, member, secure_cluster
from tests.fixtures.abandoned import HELD_OPEN, flaky_reads
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
from tests.fixtures.relay import Relay
from tests.fixtures.security import ClusterSecurity

pytestmark = pytest.mark.integration

CLICKS = Topic("clicks", Order, partitions=1)
PART, SHARD = "events/clicks/part-000", "clicks/part-000"


def relayed_events(relay: Relay, etcd: EtcdServer, consumer_root: str, dsn: str,
                   security: ClusterSecurity) -> Events:
    """An `Events` whose members reach the broker through `relay`."""
    return Events(broker_address=relay.address, etcd_address=etcd.endpoint, dsn=dsn,
                  catch_up=False, member={"host": "127.0.0.1", "lease_ttl": 3,
                                          "drain_timeout": 10.0, "etcd_root": consumer_root,
                                          **security.config()})


async def rows(dsn: str, query: str) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        return list(await (await conn.execute(query)).fetchall())


def broker_read_bytes() -> float:
    return REGISTRY.get_sample_value("gazette_client_read_bytes_total",
                                     {"source": "broker"}) or 0.0


async def test_a_read_failing_mid_transaction_handles_each_event_once(
        etcd_prefix: str, consumer_root: str, pg_database: PgDatabase, tmp_path: Path
        ) -> None:
    dsn = pg_database.dsn
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("CREATE TABLE effects (event_id TEXT NOT NULL)")
    seen: list[str] = []
    retried: list[str] = []

    async def apply(tx: Any, event: Event[Order]) -> None:
        await tx.execute("INSERT INTO effects VALUES (%s)", (event.id,))

    async def count(event: Event[Order]) -> None:
        seen.append(event.id)

    async def flaky(event: Event[Order]) -> None:
        if event.payload.id % 5 == 0 and not event.attempt:
            raise RuntimeError("not now")
        if event.attempt:
            retried.append(event.id)

    ids = [f"{b}{i}" for b in "ab" for i in range(20)]
    failing = [f"{b}{i}" for b in "ab" for i in range(0, 20, 5)]
    async with secure_cluster(tmp_path, etcd_prefix) as (etcd, broker, security), \
            JournalClient(broker.grpc_address, auth=security.client()) as client, \
            Relay(broker.grpc_address) as relay:
        await Catalog(client).partitions(CLICKS)
        # A transaction stays open until the read fails (as one gathering a long while).
        await set_group_shard(etcd.endpoint, consumer_root, "g", ShardSpec(
            SHARD, (ShardSource(PART),), **HELD_OPEN), security.etcd_tls)
        producer = new_events(broker, etcd, consumer_root, member=security.config())
        consumer = relayed_events(relay, etcd, consumer_root, dsn, security)
        consumer.exactly_once("g", CLICKS, apply)
        consumer.idempotent("g", CLICKS, count)
        consumer.idempotent("g", CLICKS, flaky, on_failure=OnFailure.RETRY_LATER,
                            retry_delay=0.5)
        async with producer, consumer:
            group = consumer.members["g"]

            def state() -> tuple[ReplicaState | None, str]:
                status = group.status(SHARD)
                return (status.state, status.error) if status is not None else (None, "")
            await eventually(lambda: state()[0] == ReplicaState.PRIMARY, "the shard runs",
                             timeout=30)
            await member_reads(producer, client, [Order(id=i, customer="c")
                                                  for i in range(20)], ids[:20])
            relay.refuse = True  # the broker out of reach: the read's retries run out
            relay.cut()
            await eventually(lambda: state()[0] == ReplicaState.RECOVERING and
                             "Unavailable" in state()[1], "the read failed", timeout=60)
            assert not seen, "the transaction closed before its read failed"
            await set_group_shard(etcd.endpoint, consumer_root, "g", ShardSpec(
                SHARD, (ShardSource(PART),)), security.etcd_tls)
            relay.refuse = False
            await producer.produce(CLICKS, *[Order(id=i, customer="c") for i in range(20)],
                                   event_ids=ids[20:])

            async def committed() -> bool:
                return await processed(dsn, "g", "apply") == 40 and len(retried) >= 8
            await eventually(committed, "every event's transaction committed, every "
                             "failure retried", timeout=60)
            retry_lines = await committed_lines(client, "events/clicks/retry/g")
    assert sorted(seen) == sorted(ids), "events handled twice"
    assert sorted(retried) == sorted(failing)
    assert sorted(line["id"] for line in retry_lines) == sorted(failing), \
        "failures routed twice to the retry journal"
    assert Counter(r[0] for r in await rows(dsn, "SELECT event_id FROM effects")) == \
        dict.fromkeys(ids, 1)


async def test_event_ids_twice_in_a_batch_apply_once_through_a_sigkill(
        etcd_prefix: str, consumer_root: str, pg_database: PgDatabase, tmp_path: Path
        ) -> None:
    dsn = pg_database.dsn
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("CREATE TABLE effects (event_id TEXT NOT NULL, member TEXT)")
    rng = random.Random(34)
    # Each of 600 events once, twice or three times, its copies a few lines apart: in one
    # batch of 20 (`events_member`), as a re-produce or an outbox re-send lands.
    lines: list[int] = []
    for i in range(600):
        lines.append(i)
        for _ in range(rng.choice((0, 1, 1, 2))):
            lines.insert(len(lines) - rng.randrange(0, 4), i)
    async with secure_cluster(tmp_path, etcd_prefix) as (etcd, broker, security):
        producer = new_events(broker, etcd, consumer_root, member=security.config())
        first = member("first", broker, etcd, dsn, consumer_root, security, tmp_path)
        second = None
        try:
            async with producer:
                await producer.produce(ORDERS, *[Order(id=i, customer=f"c{i % 7}")
                                                 for i in lines],
                                       event_ids=[f"order-{i}" for i in lines])

                async def some_done() -> bool:
                    return (await effects(dsn))[0] >= 150
                await eventually(some_done, "the first member is under way", timeout=60)
                first.kill()  # SIGKILL, in the middle of a batch
                second = member("second", broker, etcd, dsn, consumer_root, security,
                                tmp_path)

                async def all_done() -> bool:
                    return (await effects(dsn))[1] == 600
                await eventually(all_done, "every event applied", timeout=90)
                rows_, distinct, per = await effects(dsn)
        finally:
            first.kill()
            if second is not None:
                second.stop(sig=signal.SIGTERM)
    assert rows_ == distinct == 600, f"{rows_ - distinct} effects applied twice"
    assert per.get("second", 0) > 0


async def test_a_broadcast_fed_by_transactions_delivers_each_committed_event_once(
        etcd_prefix: str, tmp_path: Path) -> None:
    rng = random.Random(34)
    seen: list[str] = []
    async with secure_cluster(tmp_path, etcd_prefix) as (_, broker, security):
        auth = security.client()
        async with JournalClient(broker.grpc_address, auth=auth) as client, \
                AppendQueue(client) as queue, \
                flaky_reads(broker.grpc_address, auth) as (relay, flaky):
            await Catalog(client).partitions(CLICKS)
            broadcaster = Broadcaster(flaky, Catalog(flaky))

            async def handle(event: Event[Order]) -> None:
                seen.append(event.id)
            try:
                await broadcaster.subscribe(CLICKS, Handler("h", CLICKS, handle,
                                                            Kind.BROADCAST))
                committed = await transactions_while_cut(queue, relay, seen, rng)
                await last_delivered(queue, seen)
            finally:
                await broadcaster.close()
    delivered = [i for i in seen if i != "last"]
    assert Counter(delivered) == Counter(committed), "an event lost or delivered twice"
    for who in ("p0-", "p1-", "p2-", "tick-"):  # each producer's in its order
        assert [i for i in delivered if i.startswith(who)] == \
            [i for i in committed if i.startswith(who)]


async def last_delivered(queue: AppendQueue, seen: list[str]) -> None:
    """A last committed event, once delivered: whatever came before it was too."""
    await Publisher(queue).publish_committed(to_journal(PART), CLICKS.new_line(
        Order(id=0, customer="c"), event_id="last"))
    await eventually(lambda: "last" in seen, "the last event delivered", timeout=30)


async def transactions_while_cut(queue: AppendQueue, relay: Relay, seen: list[str],
                                 rng: random.Random) -> list[str]:
    """Three transactional producers open transactions, add events to them, commit
    them or roll them back (re-appending their last ACK), a step at a time, with a
    committed tick after each step that the subscriber must receive before the next;
    every tenth step the reader's connection is cut, so transactions stay open across
    its restarts. Returns the ids of committed events (ticks too) in commit order."""
    committed: list[str] = []
    publishers = [Publisher(queue) for _ in range(3)]
    open_ids: list[list[str]] = [[], [], []]
    last_acks: list[list[Any]] = [[], [], []]
    ticks = Publisher(queue)

    async def close(p: int, commit: bool) -> None:
        intents = publishers[p].build_ack_intents()
        if commit:
            committed.extend(open_ids[p])
            last_acks[p] = intents
        else:  # the producer "restarts" from its last committed ACK
            intents = last_acks[p]
        open_ids[p] = []
        await asyncio.gather(*(queue.append(x.journal, x.data) for x in intents))

    for step in range(160):
        p = rng.randrange(3)
        if not open_ids[p] or rng.random() < 0.6:
            event_id = f"p{p}-{step}"
            open_ids[p].append(event_id)
            await publishers[p].publish_uncommitted(to_journal(PART), CLICKS.new_line(
                Order(id=step, customer="c"), event_id=event_id))
        else:
            await close(p, commit=not last_acks[p] or rng.random() < 0.75)
        await ticks.publish_committed(to_journal(PART), CLICKS.new_line(
            Order(id=step, customer="c"), event_id=f"tick-{step}"))
        committed.append(f"tick-{step}")
        await eventually(lambda s=step: f"tick-{s}" in seen, f"tick {step} delivered",
                         timeout=30)
        if step % 10 == 9:
            before = relay.connections
            relay.cut()
            await eventually(lambda b=before: relay.connections > b, "the reader reads again",
                             timeout=30)
    for p in range(3):
        await close(p, commit=True)
    return committed


async def test_a_read_modify_write_handler_keeps_exact_totals_under_delayed_commits(
        etcd_prefix: str, consumer_root: str, pg_database: PgDatabase, tmp_path: Path
        ) -> None:
    dsn = pg_database.dsn
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("CREATE TABLE totals (customer TEXT PRIMARY KEY, cents BIGINT)")

    async def add(tx: Any, event: Event[Order]) -> None:
        cur = await tx.execute("SELECT cents FROM totals WHERE customer = %s",
                               (event.payload.customer,))
        row = await cur.fetchone()
        await tx.execute("INSERT INTO totals VALUES (%s, %s) ON CONFLICT (customer) DO "
                         "UPDATE SET cents = excluded.cents",
                         (event.payload.customer, (row[0] if row else 0) + event.payload.amount))

    async def audit(event: Event[Order]) -> None:
        if event.payload.id % 10 == 0 and not event.attempt:
            raise RuntimeError("later")  # the commit waits for this retry's append

    expected: Counter[str] = Counter()
    # (Appends are held at a relay of the broker's gRPC address: its broker serves no
    # data path, whose endpoint the member would otherwise append to directly.)
    async with secure_cluster(tmp_path, etcd_prefix, data_port=-1) as (etcd, broker, security), \
            JournalClient(broker.grpc_address, auth=security.client()) as client, \
            Relay(broker.grpc_address) as relay:
        await Catalog(client).partitions(CLICKS)
        await set_group_shard(etcd.endpoint, consumer_root, "ledger", ShardSpec(
            SHARD, (ShardSource(PART),), max_txn_duration=timedelta(milliseconds=1)),
            security.etcd_tls)
        producer = new_events(broker, etcd, consumer_root, member=security.config())
        consumer = relayed_events(relay, etcd, consumer_root, dsn, security)
        consumer.exactly_once("ledger", CLICKS, add)
        consumer.idempotent("ledger", CLICKS, audit, on_failure=OnFailure.RETRY_LATER,
                            retry_delay=0.5)
        async with producer, consumer:
            appender = consumer.members["ledger"].appender
            assert appender is not None

            async def committed(n: int) -> bool:
                return await processed(dsn, "ledger", "add") == n
            sent = 0
            for burst in range(16):
                orders = [Order(id=i, customer=f"c{i % 3}", amount=burst + 1)
                          for i in range(50)]
                for o in orders:
                    expected[o.customer] += o.amount
                if not burst % 2:
                    # The member reads on its connection; then its appends are held.
                    await member_reads(producer, client, [Order(id=1, customer="c0")])
                    relay.hold_up = True
                    await producer.produce(CLICKS, *orders)
                    sent += 51
                    await eventually(lambda a=appender: a.pending_bytes > 0,
                                     "a retry's append is held", timeout=30)
                else:  # read while the last transaction's commit waits for its append
                    await member_reads(producer, client, orders)
                    sent += 50
                    relay.cut()  # the append goes again, the commit completes
                    await eventually(lambda n=sent: committed(n), "the transactions commit",
                                     timeout=30)
            await eventually(lambda: committed(sent), "every event's transaction committed",
                             timeout=60)
    assert dict(await rows(dsn, "SELECT customer, cents FROM totals")) == expected


async def member_reads(producer: Events, client: JournalClient, orders: list[Order],
                       event_ids: list[str] | None = None) -> None:
    """Produce `orders` and return once the member (this process's only reader) has
    read them."""
    read, head = broker_read_bytes(), await client.write_head(PART)
    await producer.produce(CLICKS, *orders, event_ids=event_ids)
    size = await client.write_head(PART) - head
    await eventually(lambda: broker_read_bytes() - read >= size, "the member read them",
                     timeout=30)
