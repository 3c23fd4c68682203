"""An Iceberg table fed through faults: stream-sum's chunk journals (committed chunks,
transactions, rolled-back ones, appends sent twice) read by ``gazette-consumer serve``
members running `gazette.iceberg.IcebergSink` on its four shards, the catalog in
PostgreSQL (what several members share: a member frozen inside a commit holds the table's
row until the server ends its idle transaction; on SQLite it would hold the file's write
lock until thawed), the warehouse a folder. The busiest member is SIGKILLed (and
restarted), and one is frozen (SIGSTOP) until its shards moved, then thawed (its
commits are fenced out). Afterwards the table holds every committed chunk exactly once:
each stream's chunks 1..n+1, each once, summing to what the driver published; no
rolled-back chunk; no message twice."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gazette.client import JournalClient, RetryPolicy
from gazette.iceberg import SharedCatalog, TableConfig
from gazette_consumer.examples.stream_sum import APP, Driver
from tests.fault.cluster import pause, resume
from tests.fault.sums import (
    Cluster,
    busiest,
    others_run_all,
    restart,
    running_cluster,
    sigkill_busiest,
)
from tests.fixtures.polling import eventually
from tests.fixtures.postgres import PgDatabase

pytestmark = pytest.mark.integration

SINK = "gazette.iceberg:IcebergSink"
COLUMNS = "stream_id string, seq long, data list<long>"


class Reader:
    """The table's rows, read through one catalog (its statements under the catalog's
    deadlines: a read never hangs the test)."""

    def __init__(self, config: TableConfig) -> None:
        self.config = config
        self.catalog = SharedCatalog(config)

    def rows(self) -> list[dict[str, Any]]:
        """The rows now (none before a shard made the table)."""
        catalog = self.catalog()
        if not catalog.table_exists(self.config.identifier):
            return []
        return catalog.load_table(self.config.identifier).scan(selected_fields=(
            "_journal", "_offset", "stream_id", "seq", "data")).to_arrow().to_pylist()

    async def count(self) -> int:
        return len(await asyncio.to_thread(self.rows))


@contextlib.asynccontextmanager
async def publishing(driver: Driver) -> AsyncIterator[asyncio.Event]:
    """Waves of streams until the event is set (then the wave under way finishes)."""
    stop = asyncio.Event()

    async def run() -> None:
        while not stop.is_set():
            await driver.publish(6, 12, pace=0.01)

    task = asyncio.create_task(run())
    try:
        yield stop
        stop.set()
        await task
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def grows(table: Reader, cluster: Cluster, more: int = 50) -> None:
    """Wait until the table holds `more` rows more than now."""
    goal = await table.count() + more

    async def reached() -> bool:
        return await table.count() >= goal

    try:
        await eventually(reached, f"{more} more rows in the table", 40, interval=0.25)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{cluster.diagnosis()}") from None


@pytest.mark.timeout(280)
async def test_an_iceberg_table_holds_each_committed_chunk_once_through_member_faults(
        tmp_path: Path, pg_database: PgDatabase) -> None:
    started = time.monotonic()
    config = TableConfig(pg_database.dsn.replace("postgresql://", "postgresql+psycopg://"),
                         f"file://{tmp_path}/warehouse", "sums.chunks")
    table = Reader(config)
    env = dict(os.environ, GAZETTE_ICEBERG_CATALOG=config.uri,
               GAZETTE_ICEBERG_WAREHOUSE=config.warehouse,
               GAZETTE_ICEBERG_TABLE=config.identifier, GAZETTE_ICEBERG_COLUMNS=COLUMNS,
               CONSUMER_APP=APP)  # (stream-sum's shards)
    async with running_cluster(tmp_path) as cluster:
        members = [cluster.member(name, env, app=SINK) for name in ("m0", "m1")]
        await eventually(lambda: len(cluster.primaries()) == 4, "every shard runs", 40)
        retry = RetryPolicy(attempts=100, initial_delay=0.05, max_delay=0.5)
        async with JournalClient(cluster.target, retry=retry, timeout=10,
                                 auth=cluster.security.client()) as client, \
                Driver(client, seed=11) as driver:
            async with publishing(driver):
                await grows(table, cluster)
                # (one SIGKILL: the zombie below is the fence's harder case; a second
                # kill found nothing more and cost 15 s of the suite's budget)
                await sigkill_busiest(cluster, members, lambda: grows(table, cluster))
                # A zombie: frozen until its shards moved, then thawed: whatever it
                # commits is fenced out, and it exits for its lost lease.
                zombie = busiest(cluster, members)
                pause(zombie.process)
                cluster.faults.append(f"SIGSTOP {zombie.name}")
                await others_run_all(cluster, zombie)
                await grows(table, cluster)
                resume(zombie.process)
                await eventually(lambda: not zombie.process.running(),
                                 "the thawed zombie exits", 30)
                lease = cluster.lease_of(zombie)
                await restart(cluster, zombie, lease)
                await grows(table, cluster)
            expected = driver.expected
            want = sum(chunks + 1 for _, chunks in expected.values())

            async def complete() -> bool:
                return await table.count() >= want

            try:
                await eventually(complete, "every committed chunk in the table", 60,
                                 interval=0.5)
            except AssertionError as err:
                raise AssertionError(f"{err}\n{cluster.diagnosis()}") from None
    rows = await asyncio.to_thread(table.rows)
    twice = [k for k, n in Counter((r["_journal"], r["_offset"]) for r in rows).items()
             if n > 1]
    assert not twice, f"messages in the table twice: {twice[:5]}"
    by_stream: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_stream.setdefault(r["stream_id"], []).append(r)
    assert set(by_stream) == set(expected)
    for stream, (total, chunks) in expected.items():
        got = by_stream[stream]
        assert sorted(r["seq"] for r in got) == list(range(1, chunks + 2)), stream
        assert sum(sum(r["data"]) for r in got) == total, stream
    print(f"\niceberg faults: {len(rows)} rows, {len(expected)} streams exact; faults: "
          f"{cluster.faults}; {time.monotonic() - started:.0f}s")
