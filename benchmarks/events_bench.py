"""Events library throughput, with FastStream over NATS JetStream as the baseline.

- `produce_msgs_per_s`: typed `Order`s (pydantic) produced outside a transaction,
  `BATCH` per `produce` call, `PRODUCERS` calls at once, each waiting for its appends'
  acknowledgements (at least once).
- `outbox_msgs_per_s`: the same events produced inside PostgreSQL transactions
  (`OUTBOX_TXN` events per transaction, `OUTBOX_CONNS` connections at once), each
  published and deleted after its commit.
- `exactly_once_msgs_per_s`: an exactly-once batch handler (batches of `EO_BATCH`)
  writing one row per event into PostgreSQL, in the group's transaction with the
  processed-event records and the checkpoint; from start until every row is committed.
- `baseline_faststream_msgs_per_s`: FastStream consuming the same model from JetStream
  at least once (batches of 500, acked after the handler), and its produce rate
  (`benchmarks/faststream_baseline.py`). Target: our exactly-once consume at or above
  its at-least-once consume.

Starts etcd, a broker (`gazette.events.testing.LocalCluster`), PostgreSQL and
nats-server itself; prints one JSON object last.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fixtures

import psycopg
import uvloop
from events_models import Order, order  # type: ignore[import-not-found]
from faststream_baseline import faststream_baseline  # type: ignore[import-not-found]

from gazette.events import Event, Topic
from gazette.events.testing import LocalCluster
from tests.fixtures.postgres import create_database, start_pg_server

MESSAGES = 100_000
BATCH, PRODUCERS = 500, 4
OUTBOX_TXN, OUTBOX_CONNS, OUTBOX_MESSAGES = 100, 4, 40_000
EO_BATCH = 500
BASELINE_MESSAGES = 50_000
ORDERS = Topic("orders", Order, key=lambda o: o.customer, partitions=4)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def produce(cluster: LocalCluster) -> float:
    async with cluster.events() as events:
        await events.produce(ORDERS, order(-1))  # the topic is made before the clock
        started = time.perf_counter()

        async def producer(p: int) -> None:
            for base in range(p * BATCH, MESSAGES, PRODUCERS * BATCH):
                await events.produce(ORDERS, *[order(i) for i in range(base, base + BATCH)])
        await asyncio.gather(*(producer(p) for p in range(PRODUCERS)))
        return MESSAGES / (time.perf_counter() - started)


async def outbox(cluster: LocalCluster, dsn: str) -> float:
    async with cluster.events(dsn=dsn) as events:
        conns = [await psycopg.AsyncConnection.connect(dsn) for _ in range(OUTBOX_CONNS)]
        try:
            started = time.perf_counter()

            async def writer(c: int) -> None:
                step = OUTBOX_CONNS * OUTBOX_TXN
                for base in range(c * OUTBOX_TXN, OUTBOX_MESSAGES, step):
                    async with events.transaction(conns[c]) as tx:
                        tx.produce(ORDERS, *[order(MESSAGES + i)
                                             for i in range(base, base + OUTBOX_TXN)])
            await asyncio.gather(*(writer(c) for c in range(OUTBOX_CONNS)))
            return OUTBOX_MESSAGES / (time.perf_counter() - started)
        finally:
            for conn in conns:
                await conn.close()


async def exactly_once(cluster: LocalCluster, dsn: str, expected: int) -> float:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("CREATE TABLE orders (order_id BIGINT, customer TEXT, "
                           "amount_cents BIGINT)")
        events = cluster.events(dsn=dsn)

        @events.exactly_once("bench", ORDERS, batch_size=EO_BATCH)
        async def store(tx: Any, batch: list[Event[Order]]) -> None:
            await tx.execute(
                "INSERT INTO orders SELECT * FROM unnest(%s::bigint[], %s::text[], "
                "%s::bigint[])", ([e.payload.order_id for e in batch],
                                  [e.payload.customer for e in batch],
                                  [e.payload.amount_cents for e in batch]))

        started = time.perf_counter()
        async with events:
            while True:
                cur = await conn.execute("SELECT count(*) FROM orders")
                row = await cur.fetchone()
                if row is not None and row[0] >= expected:
                    break
                await asyncio.sleep(0.05)
            elapsed = time.perf_counter() - started
        cur = await conn.execute("SELECT count(*), count(DISTINCT order_id) FROM orders")
        row = await cur.fetchone()
        assert row == (expected, expected), f"exactly-once wrote {row}, expected {expected}"
        return expected / elapsed


async def ours(workdir: Path, dsn: str) -> dict[str, Any]:
    async with LocalCluster(workdir) as cluster:
        produced = await produce(cluster)
        log(f"produce: {produced:,.0f} msgs/s")
        boxed = await outbox(cluster, dsn)
        log(f"outbox: {boxed:,.0f} msgs/s")
        eo = await exactly_once(cluster, dsn, MESSAGES + 1 + OUTBOX_MESSAGES)
        log(f"exactly-once consume: {eo:,.0f} msgs/s")
    return {"produce_msgs_per_s": round(produced), "outbox_msgs_per_s": round(boxed),
            "exactly_once_msgs_per_s": round(eo)}


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    if shutil.which("nats-server") is None:
        sys.exit("nats-server not found (the FastStream baseline needs it): "
                 "run scripts/ensure-bench-deps.sh")
    with tempfile.TemporaryDirectory(prefix="gz-events-bench-") as tmp:
        workdir = Path(tmp)
        pg = start_pg_server(Path(tempfile.mkdtemp(prefix="gz-pg-")))  # postgres enters it
        try:
            result = uvloop.run(ours(workdir / "ours", create_database(pg).dsn))
        finally:
            pg.stop()
        (workdir / "nats").mkdir()
        base = uvloop.run(faststream_baseline(workdir / "nats", BASELINE_MESSAGES))
    log(f"FastStream baseline: {base}")
    result["baseline_faststream_msgs_per_s"] = round(base["consume_msgs_per_s"])
    result["baseline_faststream_produce_msgs_per_s"] = round(base["produce_msgs_per_s"])
    result["baseline_faststream_end_to_end_msgs_per_s"] = round(base["msgs_per_s"])
    result["exactly_once_vs_baseline"] = round(
        result["exactly_once_msgs_per_s"] / base["consume_msgs_per_s"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
