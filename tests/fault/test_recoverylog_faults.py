"""Faults against stream-sum shards whose sums are in SQLite on recovery logs, with a hot
standby each (`hot_standbys: 1`), on three ``gazette-consumer serve`` members: a
primary's member SIGKILLed, every member restarted in turn with SIGTERM (each drain hands
its shards to their caught-up standbys), the broker primary of a recovery log
SIGKILLed, etcd restarted. Afterwards every stream's sum is exact, in the output and in
the databases played back from the logs alone. The stores record in every mode, often
(`EVERY_MODE`: small commits whole, larger ones as their pages' differences,
checkpoints as copies, rewrites in the background; the logs are checked to hold each).
The test prints the longest any finished stream waited for its sum, and, during the
rolling restart, the longest wait of probes sent every 20 ms: the longest processing
pause a hand-off caused."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import tempfile
import time
from pathlib import Path

import apsw
import pytest

from gazette.allocator import assignments_of
from gazette.client import JournalClient, RetryPolicy
from gazette.keyspace import Etcd, Layout, Txn
from gazette.protocol import ReplicaState, ReplicaStatus
from gazette.recoverylog import Player
from gazette.recoverylog.ops import Decoder, Kind
from gazette_broker.reads import GAP_WAIT_SECONDS
from gazette_consumer.examples.stream_sum import APP, LOGS, Driver
from tests.fault.sums import (
    CONSUMERS,
    LEASE_TTL,
    SHARDS,
    Cluster,
    Load,
    busiest,
    member_gone,
    others_run_all,
    restart,
    running_cluster,
)
from tests.fixtures.polling import eventually

pytestmark = pytest.mark.integration


def state_of(cluster: Cluster, shard: str, zone: str, suffix: str) -> ReplicaState | None:
    assert cluster.keyspace is not None
    entry = cluster.keyspace.get(cluster.consumers.status_key(shard, zone, suffix))
    return entry.value.state if entry is not None and isinstance(
        entry.value, ReplicaStatus) else None


def standbys_ready(cluster: Cluster) -> bool:
    """Every shard has a PRIMARY and a caught-up STANDBY."""
    assert cluster.keyspace is not None
    for shard in SHARDS:
        states = {a.slot == 0: state_of(cluster, shard, a.member.zone, a.member.suffix)
                  for a in assignments_of(cluster.keyspace, cluster.consumers, shard)}
        if states != {True: ReplicaState.PRIMARY, False: ReplicaState.STANDBY}:
            return False
    return True


async def played_sums(client: JournalClient, root: Path) -> dict[str, tuple[int, int]]:
    """The finished streams' (sum, chunks) in every shard's database, played from its
    recovery log's start."""
    out: dict[str, tuple[int, int]] = {}
    for shard in SHARDS:
        folder = root / shard.replace("/", "_")
        player = Player(client, f"{LOGS}{shard}", folder, name=shard)
        await player.play()
        await player.finish()
        db = apsw.Connection(str(folder / "store.db"))
        try:
            assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            out.update({s: (total, n) for s, total, n in db.execute(
                "SELECT stream_id, sum, chunks FROM sums WHERE done")})
        finally:
            db.close()
    return out


#: SQLiteStore's options in the fault test: every way of recording, often.
EVERY_MODE = {"page_size": 1024, "rewrite_min_bytes": 64 << 10, "rewrite_factor": 0.5,
              "checkpoint_pages": 64, "patch_min_bytes": 4 << 10}


async def recorded_kinds(client: JournalClient) -> collections.Counter[Kind | str]:
    """How many operations of each kind the shards' logs hold (and "rewrites": the
    databases recorded whole, at creation and after; "patches": patches of WAL frames,
    which read files, not a rewrite's)."""
    kinds: collections.Counter[Kind | str] = collections.Counter()
    for shard in SHARDS:
        log = f"{LOGS}{shard}"
        decoder = Decoder(log, 0)
        async for chunk in client.read(log, 0, end_offset=await client.write_head(log)):
            for op, _ in decoder.feed(chunk.content):
                kinds[op.kind] += 1
                kinds["rewrites"] += op.kind is Kind.CREATE and op.path == "store.db.rewrite"
                kinds["patches"] += op.kind is Kind.PATCH and bool(op.path)
    return kinds


async def probe(driver: Driver, probes: list[str]) -> None:
    """Until cancelled: a stream of no data chunks (its last chunk only) every 20 ms;
    each one's wait for its sum is how long processing paused when it came."""
    while True:
        before = set(driver.expected)
        await driver.publish(1, 0)
        probes.extend(set(driver.expected) - before)
        await asyncio.sleep(0.02)  # pacing, not synchronization


async def ready(cluster: Cluster) -> None:
    await eventually(lambda: standbys_ready(cluster), "every shard has a primary and a "
                     "ready standby", 60)


@pytest.mark.timeout(300)
async def test_sqlite_sums_exact_with_hot_standbys_through_faults(tmp_path: Path) -> None:
    started = time.monotonic()
    # Every recording mode, often: pages as differences, checkpoints as copies, rewrites.
    env = dict(os.environ, STREAM_SUM_SQLITE=json.dumps(EVERY_MODE))
    async with running_cluster(tmp_path, recovery_logs=True, hot_standbys=1) as cluster:
        members = [cluster.member(name, env, zone) for name, zone in
                   (("m0", "zone-a"), ("m1", "zone-a"), ("m2", "zone-b"))]
        await ready(cluster)
        retry = RetryPolicy(attempts=100, initial_delay=0.05, max_delay=0.5)
        async with JournalClient(cluster.target, retry=retry,
                                 auth=cluster.security.client()) as client, \
                Driver(client, seed=11) as driver, Load(driver, cluster) as load:
            await load.progress()

            victim = busiest(cluster, members)
            lease = cluster.lease_of(victim)
            await asyncio.to_thread(victim.process.kill)
            cluster.faults.append(f"SIGKILL {victim.name}")
            await others_run_all(cluster, victim)
            await load.progress()
            await restart(cluster, victim, lease)
            await ready(cluster)
            await load.progress()

            # A rolling restart: each member drains (its primaries go to their ready
            # standbys), exits 0, comes back, and catches up before the next goes.
            # Probes (one-chunk streams, every 20 ms) time how long processing pauses.
            probes: list[str] = []
            probing = asyncio.create_task(probe(driver, probes))
            for member in members:
                lease = cluster.lease_of(member)
                await asyncio.to_thread(member.process.stop, 40.0)
                cluster.faults.append(f"SIGTERM {member.name}")
                assert member.process.popen is not None
                assert member.process.popen.returncode == 0, "a drained member exits 0"
                await load.progress()
                await restart(cluster, member, lease)
                await ready(cluster)
                await load.progress()
            probing.cancel()
            await asyncio.gather(probing, return_exceptions=True)

            log = f"{LOGS}{SHARDS[0]}"
            broker = cluster.broker_primary(log)
            assert broker is not None, f"{log} has a primary"
            await asyncio.to_thread(broker.kill)
            cluster.faults.append(f"SIGKILL {broker.name} (primary of {log})")
            await eventually(lambda: cluster.broker_primary(log) not in (broker, None),
                             "another broker is the log's primary", 4 * LEASE_TTL)
            broker.start()
            await eventually(lambda: cluster.journal_ok(log), f"{broker.name} is back", 40)
            await load.progress()

            await asyncio.to_thread(cluster.etcd.restart)
            cluster.faults.append("etcd restart")
            await load.progress()

            await load.finish()
            summary = await driver.verify(GAP_WAIT_SECONDS + 30)
            assert summary.ok, f"{summary.line()}\n{cluster.diagnosis()}"
            with tempfile.TemporaryDirectory(dir=tmp_path) as played:
                assert await played_sums(client, Path(played)) == driver.expected
            kinds = await recorded_kinds(client)
            assert kinds["patches"] and kinds[Kind.WRITE] and kinds[Kind.COPY] and \
                kinds["rewrites"] > 1, kinds
            pauses = sorted(driver.waits[p] for p in probes)
    print(f"\nrecovery-log faults (SQLite, hot_standbys 1): {summary.line()}; faults: "
          f"{cluster.faults}; longest wait for a sum {summary.longest_wait:.2f}s; during "
          f"the rolling restart, {len(pauses)} probes waited at most {pauses[-1]:.3f}s "
          f"(median {pauses[len(pauses) // 2]:.3f}s); {time.monotonic() - started:.0f}s")


#: Where the shards are made first (no member), to be copied at once to both apps.
UNUSED, TWIN = "stream-sum-unused", "stream-sum-twin"


@pytest.mark.timeout(120)
async def test_two_members_racing_to_take_fresh_shards_keep_sums_exact(
        tmp_path: Path) -> None:
    """Two members take every fresh shard at once: each is sure it is the primary (as
    a member cut off from etcd is), being a member of one of two applications given the
    same shards, logs and hints in one etcd transaction. On each empty log one hand-off
    lands first and the other after it, fencing it out: its first commit fails, and
    what it published is never committed. Both are then killed, and one member recovers
    every shard from the hints and logs they left: every sum is exact, in the output and
    in the databases played from the logs."""
    started = time.monotonic()
    env = dict(os.environ)
    async with running_cluster(tmp_path, recovery_logs=True, app_name=UNUSED) as cluster, \
            Etcd(cluster.etcd.endpoint, tls=cluster.security.etcd_tls) as etcd:
        apps = {APP: cluster.consumers, TWIN: Layout.consumer_app(TWIN, CONSUMERS)}
        first = cluster.member("m0", env)
        twin = cluster.member("t0", dict(env, CONSUMER_APP=TWIN), "zone-b")

        async def joined() -> bool:
            for layout, m in ((apps[APP], first), (apps[TWIN], twin)):
                if (await etcd.get(layout.member_key(m.zone, m.name)))[1] is None:
                    return False
            return True

        await eventually(joined, "both members joined", 30)
        unused = Layout.consumer_app(UNUSED, CONSUMERS).items
        specs = (await etcd.get_prefix(unused)).kvs
        assert len(specs) == len(SHARDS)
        txn = Txn()
        for layout in apps.values():
            for kv in specs:
                txn.put(layout.item_key(kv.key.removeprefix(unused)), kv.value)
        await txn.commit(etcd)

        async def states(shard: str) -> dict[str, ReplicaStatus]:
            out = {}
            for name, (layout, m) in {"m0": (apps[APP], first),
                                      "t0": (apps[TWIN], twin)}.items():
                _, kv = await etcd.get(layout.status_key(shard, m.zone, m.name))
                if kv is not None:
                    out[name] = ReplicaStatus.decode(kv.value)
            return out

        seen: dict[str, dict[str, ReplicaStatus]] = {}  # (the last look, if it times out)

        async def one_fenced_each() -> bool:
            for shard in SHARDS:
                found = seen[shard] = await states(shard)
                if sorted(st.state for st in found.values()) != [
                        ReplicaState.PRIMARY, ReplicaState.FAILED] or not any(
                        "fenced out" in st.error for st in found.values()):
                    return False
            return True

        retry = RetryPolicy(attempts=100, initial_delay=0.05, max_delay=0.5)
        async with JournalClient(cluster.target, retry=retry,
                                 auth=cluster.security.client()) as client, \
                Driver(client, seed=13) as driver, Load(driver, cluster) as load:
            await load.progress()
            try:
                await eventually(one_fenced_each, "each shard's loser fenced out at its "
                                 "first commit, its winner primary", 30)
            except AssertionError as err:
                looks = {shard: {m: (st.state.name, st.error[:200]) for m, st in found.items()}
                         for shard, found in seen.items()}
                raise AssertionError(f"{err}; last seen: {looks}") from None
            cluster.faults.append("two members took every fresh shard")

            lease = cluster.lease_of(first)
            for member in (first, twin):
                await asyncio.to_thread(member.process.kill)
                cluster.faults.append(f"SIGKILL {member.name}")
            await eventually(lambda: member_gone(cluster, first), "m0's lease expired",
                             4 * LEASE_TTL)
            await restart(cluster, first, lease)
            await eventually(lambda: cluster.runs_all(first), "m0 runs every shard", 30)
            await load.progress()

            await load.finish()
            summary = await driver.verify(GAP_WAIT_SECONDS + 30)
            assert summary.ok, f"{summary.line()}\n{cluster.diagnosis()}"
            with tempfile.TemporaryDirectory(dir=tmp_path) as played:
                assert await played_sums(client, Path(played)) == driver.expected
    # How many hand-offs lost the race for an empty log (the rest went one after the
    # other): processes' timing decides.
    lost = sum(m.process.log_path.read_text(errors="replace").count(
        "at 0: another writer came first") for m in (first, twin))
    print(f"\nshards taken by two members at once (SQLite on recovery logs): "
          f"{summary.line()}; faults: {cluster.faults}; {lost} of {len(SHARDS)} hand-offs "
          f"lost the race for an empty log; {time.monotonic() - started:.0f}s")
