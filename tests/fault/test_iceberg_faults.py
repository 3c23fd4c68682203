"""An Iceberg table fed through faults: stream-sum's chunk journals (committed chunks,
transactions, rolled-back ones, appends sent twice) read by ``gazette-consumer serve``
members running `gazette.iceberg.IcebergSink` on its four shards, the catalog in SQLite
shared by the members, the warehouse a folder. Members are SIGKILLed twice (and
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
from sqlalchemy.exc import OperationalError

from gazette.client import JournalClient, RetryPolicy
from gazette.iceberg import TableConfig
from gazette_consumer.examples.stream_sum import Driver
from tests.fault.cluster import pause, resume
from tests.fault.sums import Cluster, busiest, others_run_all, restart, running_cluster
from tests.fixtures.polling import eventually

pytestmark = pytest.mark.integration

SINK = "gazette.iceberg:IcebergSink"
COLUMNS = "stream_id string, seq long, data list<long>"


def table_rows(config: TableConfig) -> list[dict[str, Any]]:
    """The table's rows now (an empty list before any shard made it)."""
    for _ in range(50):
        try:
            catalog = config.catalog()
            if not catalog.table_exists(config.identifier):
                return []
            return catalog.load_table(config.identifier).scan(selected_fields=(
                "_journal", "_offset", "stream_id", "seq", "data")).to_arrow().to_pylist()
        except OperationalError:  # (SQLite's lock, held by a member's commit)
            time.sleep(0.05)
    raise AssertionError("the catalog stayed locked")


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


async def grows(config: TableConfig, cluster: Cluster, more: int = 50) -> None:
    """Wait until the table holds `more` rows more than now."""
    goal = len(await asyncio.to_thread(table_rows, config)) + more

    async def reached() -> bool:
        return len(await asyncio.to_thread(table_rows, config)) >= goal

    try:
        await eventually(reached, f"{more} more rows in the table", 40, interval=0.25)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{cluster.diagnosis()}") from None


@pytest.mark.timeout(280)
async def test_an_iceberg_table_holds_each_committed_chunk_once_through_member_faults(
        tmp_path: Path) -> None:
    started = time.monotonic()
    config = TableConfig(f"sqlite:///{tmp_path}/catalog.db", f"file://{tmp_path}/warehouse",
                         "sums.chunks")
    env = dict(os.environ, GAZETTE_ICEBERG_CATALOG=config.uri,
               GAZETTE_ICEBERG_WAREHOUSE=config.warehouse,
               GAZETTE_ICEBERG_TABLE=config.identifier, GAZETTE_ICEBERG_COLUMNS=COLUMNS)
    async with running_cluster(tmp_path) as cluster:
        members = [cluster.member(name, env, app=SINK) for name in ("m0", "m1")]
        await eventually(lambda: len(cluster.primaries()) == 4, "every shard runs", 40)
        retry = RetryPolicy(attempts=100, initial_delay=0.05, max_delay=0.5)
        async with JournalClient(cluster.target, retry=retry, timeout=10,
                                 auth=cluster.security.client()) as client, \
                Driver(client, seed=11) as driver:
            async with publishing(driver):
                await grows(config, cluster)
                for _ in range(2):
                    victim = busiest(cluster, members)
                    lease = cluster.lease_of(victim)
                    await asyncio.to_thread(victim.process.kill)
                    cluster.faults.append(f"SIGKILL {victim.name}")
                    await others_run_all(cluster, victim)
                    await grows(config, cluster)
                    await restart(cluster, victim, lease)
                    await grows(config, cluster)
                # A zombie: frozen until its shards moved, then thawed: whatever it
                # commits is fenced out, and it exits for its lost lease.
                zombie = busiest(cluster, members)
                pause(zombie.process)
                cluster.faults.append(f"SIGSTOP {zombie.name}")
                await others_run_all(cluster, zombie)
                await grows(config, cluster)
                resume(zombie.process)
                await eventually(lambda: not zombie.process.running(),
                                 "the thawed zombie exits", 30)
                lease = cluster.lease_of(zombie)
                await restart(cluster, zombie, lease)
                await grows(config, cluster)
            expected = driver.expected
            want = sum(chunks + 1 for _, chunks in expected.values())

            async def complete() -> bool:
                return len(await asyncio.to_thread(table_rows, config)) >= want

            try:
                await eventually(complete, "every committed chunk in the table", 60,
                                 interval=0.5)
            except AssertionError as err:
                raise AssertionError(f"{err}\n{cluster.diagnosis()}") from None
    rows = await asyncio.to_thread(table_rows, config)
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
