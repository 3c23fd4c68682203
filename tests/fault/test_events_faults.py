"""An exactly-once handler's effects land exactly once when its process is SIGKILLed in
the middle of a batch, another takes over, and events are sent again. Mutual TLS and
authorization are on (etcd's too): the members and the producer hold the signing keys."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest

from gazette.local import Process
from gazette.local.etcd import EmbeddedEtcd
from gazette_broker import BrokerServer
from tests.fault.events_member import ORDERS
from tests.fixtures.broker import broker_config
from tests.fixtures.etcd import EtcdServer
from tests.fixtures.events import Order, new_events
from tests.fixtures.polling import eventually
from tests.fixtures.postgres import PgDatabase
from tests.fixtures.security import ClusterSecurity

pytestmark = pytest.mark.integration
EVENTS = 1500


@contextlib.asynccontextmanager
async def secure_cluster(workdir: Path, prefix: str, **broker: object
                         ) -> AsyncIterator[tuple[EtcdServer, BrokerServer, ClusterSecurity]]:
    """An etcd and a broker of their own (its config also `broker`), both with mutual
    TLS and authorization."""
    security = ClusterSecurity.make(workdir / "pki")
    etcd = EmbeddedEtcd(workdir / "etcd", tls=security.etcd_tls)
    await asyncio.to_thread(etcd.start)
    try:
        server = BrokerServer(broker_config(etcd.endpoint, prefix, workdir,
                                            **security.config(), **broker))
        await server.start()
        try:
            yield etcd, server, security
        finally:
            await server.stop()
    finally:
        await asyncio.to_thread(etcd.stop)


def member(name: str, broker: BrokerServer, etcd: EtcdServer, dsn: str, root: str,
           security: ClusterSecurity, workdir: Path) -> Process:
    proc = Process(name, [sys.executable, "-m", "tests.fault.events_member",
                          broker.grpc_address, etcd.endpoint, dsn, root, name,
                          json.dumps(security.config())],
                   workdir / f"{name}.log", cwd=Path(__file__).parents[2])
    proc.start()
    return proc


async def effects(dsn: str) -> tuple[int, int, dict[str, int]]:
    """Rows, distinct events, and rows per member."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute("SELECT count(*), count(DISTINCT event_id) FROM effects")
        row = await cur.fetchone()
        cur = await conn.execute("SELECT member, count(*) FROM effects GROUP BY member")
        per = dict(await cur.fetchall())
    assert row is not None
    return int(row[0]), int(row[1]), per


async def test_exactly_once_effects_survive_a_sigkill_mid_batch_and_re_sent_events(
        etcd_prefix: str, consumer_root: str, pg_database: PgDatabase, tmp_path: Path
        ) -> None:
    dsn = pg_database.dsn
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("CREATE TABLE effects (event_id TEXT NOT NULL, member TEXT)")
    async with secure_cluster(tmp_path, etcd_prefix) as (etcd, broker, security):
        await run_faults(etcd, broker, security, dsn, consumer_root, tmp_path)


async def run_faults(etcd: EtcdServer, broker: BrokerServer, security: ClusterSecurity,
                     dsn: str, consumer_root: str, tmp_path: Path) -> None:
    producer = new_events(broker, etcd, consumer_root, member=security.config())
    ids = [f"order-{i}" for i in range(EVENTS)]
    first = member("first", broker, etcd, dsn, consumer_root, security, tmp_path)
    second = None
    try:
        async with producer:
            await producer.produce(ORDERS, *[Order(id=i, customer=f"c{i % 7}")
                                             for i in range(EVENTS)], event_ids=ids)

            async def some_done() -> bool:
                return (await effects(dsn))[0] >= 200
            await eventually(some_done, "the first member is under way", timeout=60)
            first.kill()  # SIGKILL, in the middle of a batch
            done_by_first = (await effects(dsn))[0]
            assert done_by_first < EVENTS, "the kill came too late to mean anything"
            second = member("second", broker, etcd, dsn, consumer_root, security, tmp_path)
            # Half of the events are sent again (as an outbox might after a crash).
            await producer.produce(ORDERS, *[Order(id=i, customer=f"c{i % 7}")
                                             for i in range(0, EVENTS, 2)],
                                   event_ids=ids[::2])

            async def all_done() -> bool:
                return (await effects(dsn))[1] == EVENTS
            await eventually(all_done, "every event applied", timeout=90)
            rows, distinct, per = await effects(dsn)
            assert rows == distinct == EVENTS, f"{rows - distinct} effects applied twice"
            assert per.get("second", 0) > 0 and per.get("first", 0) == done_by_first
    finally:
        first.kill()
        if second is not None:
            second.stop(sig=signal.SIGTERM)
