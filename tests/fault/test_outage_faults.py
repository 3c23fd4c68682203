"""Long outages against stream-sum consumers (issue 34, items 14 and 15): real etcd,
three broker processes, two ``gazette-consumer serve`` members running four shards with
their sums in SQLite on recovery logs, while the driver publishes streams.

- A broker is down for `BROKER_OUTAGE` seconds, longer than the client's retry budget
  (about 21 s): the input journals (replication 2) stay writable and the driver goes on
  committing chunks, but the recovery logs and the output need all three brokers
  (replication 3), so every shard's run ends refused (INSUFFICIENT_JOURNAL_BROKERS,
  nothing written). Once the broker is back, every shard runs again by itself (none is
  ever FAILED) and processes everything committed meanwhile.
- etcd is down for `ETCD_OUTAGE` seconds: no broker or member exits; each goes on under
  the lease it had (etcd renews leases when it restarts), and the shards go on.
- on a three-member etcd, each member is restarted in turn: no broker or member exits
  nor changes its lease, and the shards go on.

Afterwards every stream's sum is exact. Mutual TLS and authorization are on throughout.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from pathlib import Path

import pytest

from gazette.client import JournalClient
from gazette.keyspace import Event
from gazette.local import EtcdCluster
from gazette.protocol import ReplicaState, ReplicaStatus, SpecChange
from gazette_broker.reads import GAP_WAIT_SECONDS
from gazette_consumer.examples.stream_sum import CHUNKS, SUMS, Driver
from tests.fault.sums import SHARDS, Cluster, Load, running_cluster
from tests.fixtures.polling import eventually

pytestmark = pytest.mark.integration

#: Longer than a client's retry budget (35 s left every shard FAILED before issue 34).
BROKER_OUTAGE = 40.0
ETCD_OUTAGE = 10.0


async def replicate_inputs(cluster: Cluster, replication: int) -> None:
    """The chunk journals with `replication` (the others keep theirs)."""
    async with JournalClient(cluster.target, auth=cluster.security.client()) as client:
        listing = await client.list(f"prefix={CHUNKS}")
        await client.apply([SpecChange(j.spec.name, j.mod_revision,
                                       dataclasses.replace(j.spec, replication=replication))
                            for j in listing.journals])
    for j in listing.journals:
        await eventually(lambda name=j.spec.name: cluster.journal_ok(name, replication),
                         f"{j.spec.name} has {replication} replicas", 30)


def statuses_seen(cluster: Cluster) -> list[ReplicaStatus]:
    """Every replica status the members write from now on (as etcd shows them)."""
    assert cluster.keyspace is not None
    keyspace, seen = cluster.keyspace, list[ReplicaStatus]()

    def observe(revision: int, events: list[Event]) -> None:
        for ev in events:
            entry = keyspace.get(ev.kv.key)
            if entry is not None and isinstance(entry.value, ReplicaStatus):
                seen.append(entry.value)

    keyspace.observe(observe)
    return seen


@pytest.mark.timeout(480)
async def test_shards_run_again_after_a_long_broker_outage_and_members_outlive_etcds(
        tmp_path: Path) -> None:
    started = time.monotonic()
    async with running_cluster(tmp_path, recovery_logs=True) as cluster:
        await replicate_inputs(cluster, 2)
        for name, zone in (("m0", "zone-a"), ("m1", "zone-b")):
            cluster.member(name, dict(os.environ), zone)
        await eventually(lambda: len(cluster.primaries()) == len(SHARDS),
                         "every shard runs", 60)
        seen = statuses_seen(cluster)
        async with JournalClient(cluster.target, auth=cluster.security.client()) as client, \
                Driver(client, seed=13) as driver, Load(driver, cluster) as load:
            await load.progress()

            broker = cluster.broker_primary(SUMS)
            assert broker is not None
            await asyncio.to_thread(broker.kill)
            down_from = time.time()
            cluster.faults.append(f"SIGKILL {broker.name}, down {BROKER_OUTAGE:.0f}s")
            # The outage itself lasts this long (a fault's length, not a wait for a state).
            await asyncio.sleep(BROKER_OUTAGE)
            refused = [s.error for s in seen if "INSUFFICIENT_JOURNAL_BROKERS" in s.error]
            assert refused, "no shard's run was ended by the outage: the test proves nothing"
            committed = [s for s, at in driver.finished_at.items() if at > down_from + 10]
            assert committed, "the driver committed no input while the broker was down " \
                f"(streams finished at {sorted(driver.finished_at.values())[-5:]}, the " \
                f"broker went down at {down_from}; the driver's task: {load.task})"
            broker.start()
            await eventually(lambda: cluster.journal_ok(SUMS), f"{broker.name} is back", 40)
            back_at = time.monotonic()
            # Every shard runs again by itself, and processes what came meanwhile.
            await load.progress(len(committed) + 6, timeout=90)
            resumed = time.monotonic() - back_at

            leases = cluster.leases()
            await asyncio.to_thread(cluster.etcd.stop)
            await asyncio.sleep(ETCD_OUTAGE)  # the outage's length, as above
            await asyncio.to_thread(cluster.etcd.start)
            cluster.faults.append(f"etcd down {ETCD_OUTAGE:.0f}s")
            await load.progress()
            assert not cluster.exited(), f"exited in etcd's outage: {cluster.exited()}"
            assert cluster.leases() == leases, "a process joined again under a new lease"

            await load.finish()
            summary = await driver.verify(GAP_WAIT_SECONDS + 30)
            assert summary.ok, f"{summary.line()}\n{cluster.diagnosis()}"
            failed = [s.error for s in seen if s.state == ReplicaState.FAILED]
            assert not failed, f"shards failed: {failed[:3]}"
    print(f"\noutage faults: {summary.line()}; faults: {cluster.faults}; "
          f"{len(committed)} streams finished while the broker was down, "
          f"{len(refused)} runs ended refused; sums resumed {resumed:.1f}s after the "
          f"broker was back; {time.monotonic() - started:.0f}s")


@pytest.mark.timeout(240)
async def test_a_rolling_restart_of_a_three_member_etcd_stops_no_process(
        tmp_path: Path) -> None:
    started = time.monotonic()
    env = dict(os.environ, STREAM_SUM_DIR=str(tmp_path / "sums"))
    async with running_cluster(tmp_path, etcd_nodes=3) as cluster:
        cluster.member("m0", env, "zone-a")
        cluster.member("m1", env, "zone-b")
        await eventually(lambda: len(cluster.primaries()) == len(SHARDS),
                         "every shard runs", 60)
        async with JournalClient(cluster.target, auth=cluster.security.client()) as client, \
                Driver(client, seed=17) as driver, Load(driver, cluster) as load:
            await load.progress()
            leases = cluster.leases()
            etcd = cluster.etcd
            assert isinstance(etcd, EtcdCluster)
            for i in range(len(etcd.members)):
                await asyncio.to_thread(etcd.restart_member, i)
                cluster.faults.append(f"etcd member {i} restarted")
                await load.progress()
            assert not cluster.exited(), f"exited in the rolling restart: {cluster.exited()}"
            assert cluster.leases() == leases, "a process joined again under a new lease"
            await load.finish()
            summary = await driver.verify(GAP_WAIT_SECONDS + 30)
            assert summary.ok, f"{summary.line()}\n{cluster.diagnosis()}"
    print(f"\netcd rolling restart: {summary.line()}; faults: {cluster.faults}; "
          f"{time.monotonic() - started:.0f}s")
