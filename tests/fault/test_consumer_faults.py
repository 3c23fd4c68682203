"""Faults against stream-sum consumers: real etcd, three broker processes and
``gazette-consumer serve`` member processes running four shards, while the driver
publishes streams of chunks (committed, in transactions, rolled back, appends sent
twice). With SQLStore on PostgreSQL: members SIGKILLed and SIGTERMed (and restarted),
one frozen (SIGSTOP) until its shards moved and then thawed, etcd restarted, and the
primary brokers of the output and of an input journal SIGKILLed (and restarted); with
JSONFileStores, the one member is SIGKILLed and restarted again and again. Afterwards
every stream's sum is exact, in the output and in the store: nothing counted twice,
nothing missing."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gazette.client import JournalClient, RetryPolicy
from gazette_broker.reads import GAP_WAIT_SECONDS
from gazette_consumer.examples.stream_sum import CHUNKS, SUMS, Driver
from tests.fault.cluster import pause, resume
from tests.fault.sums import (
    LEASE_TTL,
    Load,
    busiest,
    others_run_all,
    restart,
    running_cluster,
    sigkill_busiest,
)
from tests.fixtures.polling import eventually
from tests.fixtures.postgres import PgDatabase

pytestmark = pytest.mark.integration


@pytest.mark.timeout(240)  # the bound: under 4 minutes
async def test_sql_sums_exact_through_member_etcd_and_broker_faults(
        tmp_path: Path, pg_database: PgDatabase) -> None:
    started = time.monotonic()
    env = dict(os.environ, STREAM_SUM_DSN=pg_database.dsn)
    async with running_cluster(tmp_path) as cluster:
        members = [cluster.member(name, env, zone) for name, zone in
                   (("m0", "zone-a"), ("m1", "zone-a"), ("m2", "zone-b"))]
        await eventually(lambda: len(cluster.primaries()) == 4, "every shard runs", 40)
        retry = RetryPolicy(attempts=100, initial_delay=0.05, max_delay=0.5)
        async with JournalClient(cluster.target, retry=retry, timeout=10,
                                 auth=cluster.security.client()) as client, \
                Driver(client, seed=7) as driver, Load(driver, cluster) as load:
            await load.progress()
            for _ in range(2):
                victim = await sigkill_busiest(cluster, members, load.progress)
                other = busiest(cluster, [m for m in members if m is not victim])
                lease = cluster.lease_of(other)
                await asyncio.to_thread(other.process.stop, 40.0)
                cluster.faults.append(f"SIGTERM {other.name}")
                assert other.process.popen is not None
                assert other.process.popen.returncode == 0, "a drained member exits 0"
                await load.progress()
                await restart(cluster, other, lease)
                await load.progress()

            # A zombie: frozen until its lease expired and its shards moved, then thawed
            # (its commits, if any, are fenced out), and it exits for its lost lease.
            zombie = busiest(cluster, members)
            pause(zombie.process)
            cluster.faults.append(f"SIGSTOP {zombie.name}")
            await others_run_all(cluster, zombie)
            await load.progress()
            resume(zombie.process)
            cluster.faults.append(f"SIGCONT {zombie.name}")
            await eventually(lambda: not zombie.process.running(),
                             f"{zombie.name} exits, having lost its lease", 20)
            assert zombie.process.popen is not None
            assert zombie.process.popen.returncode == 1, "a member that lost its lease exits 1"
            await restart(cluster, zombie, 0)
            await load.progress()

            await asyncio.to_thread(cluster.etcd.restart)
            cluster.faults.append("etcd restart")
            await load.progress()

            for journal in (SUMS, f"{CHUNKS}part-000"):
                broker = cluster.broker_primary(journal)
                assert broker is not None, f"{journal} has a primary"
                await asyncio.to_thread(broker.kill)
                cluster.faults.append(f"SIGKILL {broker.name} (primary of {journal})")
                # Its lease expires: another broker is primary, but with two of three
                # brokers appends are refused until it is back (replication 3).
                await eventually(lambda b=broker, j=journal: cluster.broker_primary(j)
                                 not in (b, None), "another broker is the primary",
                                 4 * LEASE_TTL)
                broker.start()
                await eventually(lambda j=journal: cluster.journal_ok(j),
                                 f"{broker.name} is back", 40)
                await load.progress()

            await load.finish()
            # A reader may wait up to GAP_WAIT_SECONDS for offsets that only a killed
            # broker held (an append in doubt, which the driver sent again) before it
            # skips them.
            summary = await driver.verify(GAP_WAIT_SECONDS + 30)
            assert summary.ok, f"{summary.line()}\n{cluster.diagnosis()}"
            async with await psycopg.AsyncConnection.connect(pg_database.dsn) as conn:
                rows = await (await conn.execute(
                    "SELECT stream_id, sum, chunks FROM stream_sums WHERE done")).fetchall()
            assert {s: (total, n) for s, total, n in rows} == driver.expected
    print(f"\nconsumer faults (SQLStore): {summary.line()}; faults: {cluster.faults}; "
          f"{time.monotonic() - started:.0f}s")


@pytest.mark.timeout(240)  # the bound: under 4 minutes
async def test_json_sums_exact_through_a_member_killed_again_and_again(
        tmp_path: Path) -> None:
    started = time.monotonic()
    env = dict(os.environ, STREAM_SUM_DIR=str(tmp_path / "sums"))
    async with running_cluster(tmp_path) as cluster:
        member = cluster.member("m0", env)
        await eventually(lambda: len(cluster.primaries()) == 4, "every shard runs", 40)
        retry = RetryPolicy(attempts=100, initial_delay=0.05, max_delay=0.5)
        async with JournalClient(cluster.target, retry=retry, timeout=10,
                                 auth=cluster.security.client()) as client, \
                Driver(client, seed=8) as driver, Load(driver, cluster) as load:
            await load.progress()
            for _ in range(5):
                lease = cluster.lease_of(member)
                await asyncio.to_thread(member.process.kill)
                cluster.faults.append(f"SIGKILL {member.name}")
                await restart(cluster, member, lease)
                await eventually(lambda: cluster.runs_all(member),
                                 "the restarted member runs every shard", 30)
                await load.progress(10)
            await load.finish()
            summary = await driver.verify(30)
            assert summary.ok, f"{summary.line()}\n{cluster.diagnosis()}"
    states: dict[str, dict[str, Any]] = {}
    for path in (tmp_path / "sums").glob("*.json"):
        states.update(json.loads(path.read_text())["state"])
    assert {s: (row["sum"], row["chunks"]) for s, row in states.items() if row["done"]} \
        == driver.expected
    print(f"\nconsumer faults (JSONFileStore): {summary.line()}; faults: {cluster.faults}; "
          f"{time.monotonic() - started:.0f}s")
