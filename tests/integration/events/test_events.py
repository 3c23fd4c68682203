"""The events library against a real broker, etcd and PostgreSQL: typed produce and
consume, the outbox, exactly-once handlers, failure policies, broadcast, batching."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from gazette.client import JournalClient
from gazette.events import (
    Event,
    Events,
    EventTypeError,
    OnFailure,
    Topic,
    TopicNotRegistered,
)
from gazette.events.outbox import OUTBOX
from gazette.message import JsonMessage, Partition, Publisher
from gazette_broker import BrokerServer
from tests.fixtures.etcd import EtcdServer
from tests.fixtures.events import Order, Ping, Refund, committed_lines, new_events
from tests.fixtures.polling import eventually
from tests.fixtures.postgres import PgDatabase

pytestmark = pytest.mark.integration

ORDERS = Topic("orders", Order, key=lambda o: o.customer, partitions=2)


@pytest.fixture
async def client(broker_server: BrokerServer) -> AsyncIterator[JournalClient]:
    async with JournalClient(broker_server.grpc_address) as c:
        yield c


async def topic_lines(client: JournalClient, topic: str, partitions: int = 2
                      ) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(partitions):
        out += await committed_lines(client, f"events/{topic}/part-{i:03d}")
    return out


def orders(n: int, start: int = 0) -> list[Order]:
    return [Order(id=i, customer=f"c{i % 3}", amount=i) for i in range(start, start + n)]


async def test_typed_produce_reaches_an_idempotent_handler_once_per_event(
        broker_server: BrokerServer, etcd_server: EtcdServer, consumer_root: str,
        client: JournalClient) -> None:
    events = new_events(broker_server, etcd_server, consumer_root)
    seen: list[Event[Order]] = []

    @events.idempotent("billing", ORDERS)
    async def bill(event: Event[Order]) -> None:
        seen.append(event)

    async with events:
        await events.produce(ORDERS, *orders(20))
        # An append repeated as is (same UUID: a retried append) is dropped by readers.
        line = (await committed_lines(client, "events/orders/part-000"))[0]
        await client.append("events/orders/part-000", msg_bytes(line))
        await eventually(lambda: len(seen) >= 20, "20 events handled", timeout=30)
        await events.produce(ORDERS, Order(id=99, customer="z"))
        await eventually(lambda: any(e.payload.id == 99 for e in seen), "a later event",
                         timeout=30)
    assert sorted(e.payload.id for e in seen) == [*range(20), 99]
    assert all(isinstance(e.payload, Order) for e in seen)
    by_key = {e.key for e in seen if e.payload.customer == "c1"}
    assert by_key == {"c1"}  # the topic's key function
    assert len({e.journal for e in seen if e.key == "c1"}) == 1  # one key, one partition


def msg_bytes(line: dict[str, Any]) -> bytes:
    import msgspec

    return msgspec.json.encode(line) + b"\n"


async def test_a_transaction_that_rolls_back_publishes_nothing_and_one_that_commits_publishes(
        broker_server: BrokerServer, etcd_server: EtcdServer, consumer_root: str,
        client: JournalClient, pg_database: PgDatabase) -> None:
    events = new_events(broker_server, etcd_server, consumer_root, dsn=pg_database.dsn)
    async with events, await psycopg.AsyncConnection.connect(pg_database.dsn) as conn:
        await conn.execute("CREATE TABLE placed (id INT PRIMARY KEY)")
        await conn.commit()
        with pytest.raises(RuntimeError, match="changed my mind"):
            async with events.transaction(conn) as tx:
                await tx.connection.execute("INSERT INTO placed VALUES (1)")
                tx.produce(ORDERS, Order(id=1, customer="a"))
                raise RuntimeError("changed my mind")
        async with events.transaction(conn) as tx:
            await tx.connection.execute("INSERT INTO placed VALUES (2)")
            tx.produce(ORDERS, Order(id=2, customer="a"), Order(id=3, customer="b"))
        lines = await topic_lines(client, "orders")
        assert sorted(ln["data"]["id"] for ln in lines) == [2, 3]
        cur = await conn.execute(f"SELECT count(*) FROM {OUTBOX}")
        assert (await cur.fetchone()) == (0,)  # published, then deleted
        cur = await conn.execute("SELECT id FROM placed")
        assert await cur.fetchall() == [(2,)]
        await conn.commit()
        # A connection already in a transaction is refused: the commit must be ours.
        await conn.execute("SELECT 1")
        with pytest.raises(Exception, match="already in a transaction"):
            async with events.transaction(conn):
                pass


CRASHING_PRODUCER = textwrap.dedent("""
    import asyncio, os, signal, sys
    import psycopg
    from gazette.events import Events, Topic
    from tests.fixtures.events import Order

    async def main(broker, etcd, dsn):
        events = Events(broker_address=broker, etcd_address=etcd, dsn=dsn, catch_up=False)
        async def crash(rows, path):  # the process dies after the commit, before publishing
            os.kill(os.getpid(), signal.SIGKILL)
        events._publish_rows = crash
        async with events, await psycopg.AsyncConnection.connect(dsn) as conn:
            async with events.transaction(conn) as tx:
                tx.produce(Topic("orders", Order, key=lambda o: o.customer, partitions=2),
                           *[Order(id=i, customer=f"c{i}") for i in range(50)])
    asyncio.run(main(*sys.argv[1:]))
""")


async def test_the_outbox_survives_a_crash_between_commit_and_publish(
        broker_server: BrokerServer, etcd_server: EtcdServer, consumer_root: str,
        client: JournalClient, pg_database: PgDatabase) -> None:
    proc = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", CRASHING_PRODUCER, broker_server.grpc_address,
                         etcd_server.endpoint, pg_database.dsn],
        capture_output=True, timeout=60)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    async with await psycopg.AsyncConnection.connect(pg_database.dsn) as conn:
        cur = await conn.execute(f"SELECT count(*) FROM {OUTBOX}")
        assert (await cur.fetchone()) == (50,)  # committed, not published
    # Two catch-up producers at once: each row goes out once.
    sweepers = [new_events(broker_server, etcd_server, consumer_root, dsn=pg_database.dsn,
                           catch_up=False, catch_up_min_age=0.0) for _ in range(2)]
    for sweeper in sweepers:
        sweeper.register(ORDERS)
    async with sweepers[0], sweepers[1]:
        sent = await asyncio.gather(*(s.catch_up_now() for s in sweepers))
        assert sum(sent) == 50
        assert await sweepers[0].catch_up_now() == 0
    lines = await topic_lines(client, "orders")
    assert sorted(ln["data"]["id"] for ln in lines) == list(range(50))
    assert len({ln["id"] for ln in lines}) == 50


async def test_the_catch_up_producer_runs_by_itself(
        broker_server: BrokerServer, etcd_server: EtcdServer, consumer_root: str,
        client: JournalClient, pg_database: PgDatabase) -> None:
    events = new_events(broker_server, etcd_server, consumer_root, dsn=pg_database.dsn)
    async with events, await psycopg.AsyncConnection.connect(pg_database.dsn) as conn:
        await orders_ready(events)
        await conn.execute(f"INSERT INTO {OUTBOX} (topic, event_id, key, time, data) VALUES "
                           "('orders', 'left-behind', 'k', 0, %s)",
                           (b'{"id": 7, "customer": "k"}',))
        await conn.commit()

        async def published() -> bool:
            return any(ln["id"] == "left-behind" for ln in await topic_lines(client, "orders"))
        await eventually(published, "the swept row is published", timeout=20)


async def orders_ready(events: Any) -> None:
    await events.catalog.partitions(ORDERS)


async def test_an_exactly_once_handler_applies_a_re_sent_event_once(
        broker_server: BrokerServer, etcd_server: EtcdServer, consumer_root: str,
        pg_database: PgDatabase) -> None:
    events = new_events(broker_server, etcd_server, consumer_root, dsn=pg_database.dsn)
    async with await psycopg.AsyncConnection.connect(pg_database.dsn, autocommit=True) as c:
        await c.execute("CREATE TABLE totals (customer TEXT PRIMARY KEY, total INT)")
    calls: list[int] = []

    @events.exactly_once("ledger", ORDERS)
    async def add(tx: Any, event: Event[Order]) -> None:
        calls.append(event.payload.id)
        await tx.execute("INSERT INTO totals VALUES (%s, %s) ON CONFLICT (customer) DO UPDATE "
                         "SET total = totals.total + excluded.total",
                         (event.payload.customer, event.payload.amount))

    expected: dict[str, int] = {"c0": 1000}
    for o in orders(10):
        expected[o.customer] = expected.get(o.customer, 0) + o.amount
    async with events:
        await events.produce(ORDERS, *orders(10), event_ids=[f"e{i}" for i in range(10)])
        # The same events sent again (as after an outbox crash): new UUIDs, same ids.
        await events.produce(ORDERS, *orders(10), event_ids=[f"e{i}" for i in range(10)])
        await events.produce(ORDERS, Order(id=100, customer="c0", amount=1000),
                             event_ids=["last"])
        # Every event committed: a handler called is not its transaction committed (the
        # last event's partition says nothing of the others' shards either).
        await eventually(lambda: set(calls) >= {*range(10), 100}, "every event handled",
                         timeout=30)
        await eventually(lambda: _totals_are(pg_database.dsn, expected),
                         f"the committed totals are {expected}", timeout=30)
    async with await psycopg.AsyncConnection.connect(pg_database.dsn) as c:
        cur = await c.execute("SELECT customer, total FROM totals ORDER BY customer")
        rows = dict(await cur.fetchall())
    assert rows == expected  # none applied twice
    assert sorted(calls) == [*range(10), 100]


async def test_failure_policies(broker_server: BrokerServer, etcd_server: EtcdServer,
                                consumer_root: str, client: JournalClient) -> None:
    events = new_events(broker_server, etcd_server, consumer_root)
    handled: dict[str, list[tuple[int, int]]] = {"discard": [], "block": [], "later": [],
                                                  "save": []}
    fails = {"block": 2}

    def fail_on_7(name: str, event: Event[Order]) -> None:
        if event.payload.id == 7:
            if name == "block":
                if fails["block"]:
                    fails["block"] -= 1
                    raise RuntimeError("transient")
            elif name != "later" or event.attempt == 0:
                raise RuntimeError(f"{name} cannot take 7")
        handled[name].append((event.payload.id, event.attempt))

    for name, policy in (("discard", OnFailure.DISCARD), ("block", OnFailure.BLOCK),
                         ("later", OnFailure.RETRY_LATER), ("save", OnFailure.SAVE)):
        async def handler(event: Event[Order], name: str = name) -> None:
            fail_on_7(name, event)
        events.idempotent("policies", ORDERS, handler, name=name, on_failure=policy,
                          retry_delay=0.5)

    one_partition = [Order(id=i, customer="same") for i in range(10)]
    async with events:
        await events.produce(ORDERS, *one_partition)
        await eventually(lambda: (7, 1) in handled["later"], "the retried event", timeout=30)
        await eventually(lambda: len(handled["block"]) == 10, "block handles all", timeout=30)

        async def saved() -> bool:
            return bool(await committed_lines(client, "events/orders/dead/policies"))
        await eventually(saved, "a dead letter", timeout=30)
    assert [i for i, _ in handled["discard"]] == [0, 1, 2, 3, 4, 5, 6, 8, 9]
    assert [i for i, _ in handled["block"]] == list(range(10))  # 7 in its place: it waited
    assert [i for i, _ in handled["save"]] == [0, 1, 2, 3, 4, 5, 6, 8, 9]
    assert sorted(handled["later"]) == sorted([*((i, 0) for i in range(10) if i != 7), (7, 1)])
    dead = await committed_lines(client, "events/orders/dead/policies")
    assert [(d["handler"], d["data"]["id"], d["attempt"]) for d in dead] == [("save", 7, 1)]
    assert "save cannot take 7" in dead[0]["error"]
    retries = await committed_lines(client, "events/orders/retry/policies")
    assert [(r["handler"], r["data"]["id"], r["attempt"]) for r in retries] == [("later", 7, 1)]


async def test_retry_later_gives_up_to_the_dead_letters_after_max_attempts(
        broker_server: BrokerServer, etcd_server: EtcdServer, consumer_root: str,
        client: JournalClient) -> None:
    events = new_events(broker_server, etcd_server, consumer_root)
    attempts: list[int] = []

    @events.idempotent("stubborn", ORDERS, on_failure=OnFailure.RETRY_LATER,
                       retry_delay=0.2, max_attempts=3)
    async def never(event: Event[Order]) -> None:
        attempts.append(event.attempt)
        raise ValueError("never")

    async with events:
        await events.produce(ORDERS, Order(id=1, customer="x"))

        async def dead() -> bool:
            return bool(await committed_lines(client, "events/orders/dead/stubborn"))
        await eventually(dead, "the event given up", timeout=30)
    assert attempts == [0, 1, 2]
    [letter] = await committed_lines(client, "events/orders/dead/stubborn")
    assert letter["attempt"] == 3 and "ValueError: never" in letter["error"]


async def test_a_type_mismatch_is_a_clear_error_routed_by_the_policy(
        broker_server: BrokerServer, etcd_server: EtcdServer, consumer_root: str,
        client: JournalClient) -> None:
    events = new_events(broker_server, etcd_server, consumer_root)
    wrong = Topic("orders", Refund, partitions=2)  # another service's idea of the topic
    got: list[int] = []

    @events.idempotent("typed", ORDERS, on_failure=OnFailure.SAVE)
    async def take(event: Event[Order]) -> None:
        got.append(event.payload.id)

    async with events:
        await events.produce(wrong, Refund(order_id=5, reason="broken"))
        await events.produce(ORDERS, Order(id=6, customer="k"))

        async def saved() -> bool:
            return bool(await committed_lines(client, "events/orders/dead/typed"))
        await eventually(saved, "the mismatch saved", timeout=30)
        await eventually(lambda: got == [6], "the good event handled", timeout=30)
    [letter] = await committed_lines(client, "events/orders/dead/typed")
    assert letter["data"] == {"order_id": 5, "reason": "broken"}
    assert "EventTypeError" in letter["error"] and "does not fit Order" in letter["error"]
    assert "id" in letter["error"]  # the field that is missing
    with pytest.raises(EventTypeError, match="customer"):
        ORDERS.from_data({"id": 1}, "e1")


async def test_broadcast_reaches_every_instance_with_opt_in_and_out(
        broker_server: BrokerServer, etcd_server: EtcdServer, consumer_root: str) -> None:
    pings = Topic("pings", Ping, key=lambda p: str(p.n % 2), partitions=2)
    a, b = (new_events(broker_server, etcd_server, consumer_root) for _ in range(2))
    got_a: list[int] = []
    got_b: list[int] = []

    @a.broadcast(pings)
    async def on_a(event: Event[Ping]) -> None:
        got_a.append(event.payload.n)

    async with a, b:
        await a.produce(pings, Ping(n=-1))  # before b subscribes: b never sees it
        await eventually(lambda: got_a == [-1], "a's first ping")

        async def on_b(event: Event[Ping]) -> None:
            got_b.append(event.payload.n)
        sub = await b.subscribe(pings, on_b, keys={"0"})  # even numbers only
        every_b: list[int] = []

        async def on_every_b(event: Event[Ping]) -> None:
            every_b.append(event.payload.n)
        await b.subscribe(pings, on_every_b)
        await a.produce(pings, *[Ping(n=i) for i in range(6)])
        await eventually(lambda: len(got_a) == 7 and len(every_b) == 6, "all got theirs")
        assert sorted(got_b) == [0, 2, 4]
        sub.add_keys("1")
        await b.produce(pings, Ping(n=7))
        await eventually(lambda: 7 in got_b and 7 in got_a, "the widened filter")
        await sub.close()
        await b.produce(pings, Ping(n=8))
        await eventually(lambda: 8 in got_a, "a still subscribed")
    assert sorted(got_a) == [-1, 0, 1, 2, 3, 4, 5, 7, 8]
    assert sorted(got_b) == [0, 2, 4, 7]


async def test_batch_handlers_limit_batch_size_concurrency_and_time(
        broker_server: BrokerServer, etcd_server: EtcdServer, consumer_root: str,
        client: JournalClient) -> None:
    events = new_events(broker_server, etcd_server, consumer_root)
    batches: list[list[int]] = []
    running, most = 0, 0
    release = asyncio.Event()

    @events.idempotent("bulk", ORDERS, batch_size=4, concurrency=2)
    async def bulk(evs: list[Event[Order]]) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            await asyncio.wait_for(release.wait(), 5)
        finally:
            running -= 1
        batches.append([e.payload.id for e in evs])

    @events.idempotent("bulk", ORDERS, timeout=0.2, on_failure=OnFailure.SAVE)
    async def slow(event: Event[Order]) -> None:
        if event.payload.id == 3:
            await asyncio.sleep(5)  # the handler hangs: its timeout fails it

    async with events:
        await events.produce(ORDERS, *[Order(id=i, customer="one") for i in range(12)])
        await eventually(lambda: running == 2, "two batches at once")
        release.set()
        await eventually(lambda: sum(map(len, batches)) == 12, "every event in a batch",
                         timeout=30)

        async def saved() -> bool:
            return bool(await committed_lines(client, "events/orders/dead/bulk"))
        await eventually(saved, "the slow one saved", timeout=30)
    assert most == 2
    assert all(1 <= len(b) <= 4 for b in batches)
    assert sorted(i for b in batches for i in b) == list(range(12))
    [letter] = await committed_lines(client, "events/orders/dead/bulk")
    assert letter["data"]["id"] == 3 and "timeout" in letter["error"]


async def test_registration_and_topic_creation_fail_clearly(
        broker_server: BrokerServer, etcd_server: EtcdServer, consumer_root: str) -> None:
    strict = new_events(broker_server, etcd_server, consumer_root, require_registration=True)
    async with strict:
        with pytest.raises(TopicNotRegistered, match="not registered"):
            await strict.produce(ORDERS, Order(id=1, customer="a"))
        strict.register(ORDERS)
        await strict.produce(ORDERS, Order(id=1, customer="a"))
        with pytest.raises(Exception, match="expects a Order, got a Refund"):
            await strict.produce(ORDERS, Refund(order_id=1, reason=""))
    fixed = new_events(broker_server, etcd_server, consumer_root, create_topics=False)
    async with fixed:
        with pytest.raises(TopicNotRegistered, match="gazctl events create-topic nowhere"):
            await fixed.produce(Topic("nowhere", Order), Order(id=1, customer="a"))
    with pytest.raises(Exception, match="topic"):
        Topic("bad name!", Order)

    async def handler(event: Event[Order]) -> None:
        pass
    with pytest.raises(Exception, match="group: 'bad group!' has invalid character"):
        strict.idempotent("bad group!", ORDERS, handler)
    # A misspelt member option is refused at once, not when a group first joins (or
    # never, for a process that only produces: a security option would be lost).
    with pytest.raises(Exception, match="member: unknown option 'auth_tokn'"):
        Events(member={"auth_tokn": "x"})
    with pytest.raises(Exception, match="member: unknown option 'app_name'"):
        Events(member={"app_name": "mine"})


async def test_a_partition_journal_written_directly_is_read_too(
        broker_server: BrokerServer, etcd_server: EtcdServer, consumer_root: str,
        client: JournalClient) -> None:
    """Events written by another Gazette producer (any JSON line with id and data)."""
    events = new_events(broker_server, etcd_server, consumer_root)
    got: list[str] = []

    @events.idempotent("foreign", ORDERS)
    async def take(event: Event[Order]) -> None:
        got.append(event.id)

    async with events:
        await orders_ready(events)
        publisher = Publisher(client)  # type: ignore[arg-type]
        part = Partition("events/orders/part-001", "application/x-ndjson")
        await publisher.publish_committed(lambda m: part, JsonMessage(
            id="from-go", key="k", time=0.0, data={"id": 1, "customer": "k"}))
        await eventually(lambda: got == ["from-go"], "the foreign event", timeout=30)


async def _totals_are(dsn: str, expected: dict[str, int]) -> bool:
    """Whether the committed totals are `expected`."""
    async with await psycopg.AsyncConnection.connect(dsn) as c:
        cur = await c.execute("SELECT customer, total FROM totals")
        return dict(await cur.fetchall()) == expected
