"""The allocator hands a shard over only to a replica that caught up, over a real etcd.

Consumer members check consistency by replica status (`status_consistent`): a leaving
primary keeps its shard until its successor reports STANDBY. With `hot_standbys: 1` the
standby it had takes over (not a fresh member); with `hot_standbys: 0` the allocator adds
a replica first (over-replication) and waits for it. The test plays the members' part:
it acknowledges routes and writes statuses, as `LocalShard`s would.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from gazette.allocator import Allocator, read_state, route_of
from gazette.cluster import status_consistent
from gazette.keyspace import Etcd, KeySpace, Layout, Lease, Txn
from gazette.keyspace.specs import Decoder, apply_changes, encode_consumer
from gazette.protocol import MemberSpec, ProcessId, ReplicaState, ReplicaStatus
from gazette.protocol.trees import shard_changes_from_yaml

pytestmark = pytest.mark.integration

SHARD = "handoff/shard"
SPEC = """
id: handoff/shard
sources: [{{journal: handoff/in}}]
recovery_log_prefix: logs
hint_prefix: /hints
hot_standbys: {standbys}
"""
A, B, C = ProcessId("z1", "a"), ProcessId("z1", "b"), ProcessId("z1", "c")


@dataclass
class Members:
    """Three members' leases and member keys; one allocator (the leader's) over them."""

    etcd: Etcd
    layout: Layout
    leases: dict[ProcessId, Lease] = field(default_factory=dict)
    keyspace: KeySpace[Any] | None = None
    allocator: Allocator | None = None

    async def put(self, pid: ProcessId, limit: int) -> None:
        spec = MemberSpec(pid, f"http://{pid.suffix}.test:8080", limit)
        await self.etcd.put(self.layout.member_key(pid.zone, pid.suffix),
                            encode_consumer(spec), lease=self.leases[pid].id)

    def assigned(self) -> dict[ProcessId, int]:
        """Members of the shard → their slot."""
        assert self.keyspace is not None
        state = read_state(self.keyspace, self.layout, lambda spec: 1)
        return {a.member: a.slot for a in state.assignments.get(SHARD, [])}

    async def status(self, pid: ProcessId, state: ReplicaState) -> None:
        await self.etcd.put(self.layout.status_key(SHARD, pid.zone, pid.suffix),
                            ReplicaStatus(state).encode(), lease=self.leases[pid].id)

    async def acknowledge(self) -> None:
        """The primary announces the route into every assignment (as `Announcer`)."""
        assert self.keyspace is not None
        entries = self.keyspace.prefixed(self.layout.assignments + SHARD + "#")
        state = read_state(self.keyspace, self.layout, lambda spec: 1)
        route = route_of(state.assignments[SHARD]).encode()
        txn = Txn()
        for e in entries:
            txn.expect(e.kv.key, e.kv.mod_revision).put(e.kv.key, route, lease=e.kv.lease)
        await txn.commit(self.etcd)

    async def until(self, check: Callable[[], bool], timeout: float = 15.0) -> None:
        async with asyncio.timeout(timeout):
            while not check():  # noqa: ASYNC110 - polling a mirror under a deadline
                await asyncio.sleep(0.02)

    async def holds(self) -> None:
        """The leader, with everything written so far in view, has nothing to write:
        the hand-off waits."""
        assert self.keyspace is not None and self.allocator is not None
        revision, _ = await self.etcd.get(self.layout.root)
        await self.keyspace.wait_for_revision(revision, timeout=10)
        assert not await self.allocator.converge()


@contextlib.asynccontextmanager
async def members(etcd: Etcd, prefix: str, standbys: int) -> AsyncIterator[Members]:
    layout = Layout.consumer_app("handoff", prefix)
    ms = Members(etcd, layout)
    await apply_changes(etcd, layout, shard_changes_from_yaml(SPEC.format(standbys=standbys)))
    for pid in (A, B, C):
        ms.leases[pid] = await Lease.grant(etcd, 30)
    await ms.put(A, 100)  # A joins first: it leads
    keyspace: KeySpace[Any] = KeySpace(etcd, layout.root + "/", Decoder(layout, consumers=True))
    await keyspace.__aenter__()
    ms.keyspace = keyspace
    allocator = ms.allocator = Allocator(
        etcd, keyspace, layout, A, replication_of=lambda spec: 1 + int(spec.hot_standbys),
        is_consistent=status_consistent(keyspace, layout))
    task = asyncio.create_task(allocator.run())
    try:
        yield ms
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await keyspace.__aexit__(None, None, None)
        for lease in ms.leases.values():
            await etcd.lease_revoke(lease.id)


async def test_a_leaving_primary_waits_for_a_fresh_replica_to_catch_up(
    etcd: Etcd, etcd_prefix: str,
) -> None:
    async with members(etcd, etcd_prefix, standbys=0) as ms:
        await ms.until(lambda: ms.assigned() == {A: 0})
        await ms.acknowledge()
        await ms.status(A, ReplicaState.PRIMARY)
        await ms.put(B, 100)
        await ms.put(A, 0)  # A drains (B is the only member with room)
        # Over-replication: B is added beside A, which stays primary.
        await ms.until(lambda: B in ms.assigned())
        assert ms.assigned()[A] == 0 and ms.assigned()[B] != 0
        await ms.acknowledge()
        await ms.status(B, ReplicaState.RECOVERING)
        await ms.holds()
        assert ms.assigned()[A] == 0 and ms.assigned()[B] != 0

        # B caught up: the hand-off happens, in one step.
        await ms.status(B, ReplicaState.STANDBY)
        await ms.until(lambda: ms.assigned() == {B: 0})


async def test_a_leaving_primary_hands_over_to_its_ready_standby(
    etcd: Etcd, etcd_prefix: str,
) -> None:
    async with members(etcd, etcd_prefix, standbys=1) as ms:
        await ms.put(B, 100)
        await ms.until(lambda: set(ms.assigned()) == {A, B})
        primary = next(m for m, slot in ms.assigned().items() if slot == 0)
        standby = B if primary == A else A
        await ms.acknowledge()
        await ms.status(primary, ReplicaState.PRIMARY)
        await ms.status(standby, ReplicaState.STANDBY)
        await ms.put(C, 100)
        await ms.until(lambda: C not in ms.assigned() and len(ms.assigned()) == 2)
        await ms.put(primary, 0)  # the primary drains
        # C is added as the new standby; the primary holds on until C caught up too.
        await ms.until(lambda: C in ms.assigned())
        await ms.acknowledge()
        await ms.status(C, ReplicaState.RECOVERING)
        await ms.holds()
        assert ms.assigned()[primary] == 0
        await ms.status(C, ReplicaState.STANDBY)
        # The standby that was caught up takes over; C stays its standby.
        await ms.until(lambda: ms.assigned() == {standby: 0, C: ms.assigned().get(C, 0)}
                       and ms.assigned()[C] != 0)


async def test_a_failed_primary_holds_nothing_back(etcd: Etcd, etcd_prefix: str) -> None:
    async with members(etcd, etcd_prefix, standbys=0) as ms:
        await ms.until(lambda: ms.assigned() == {A: 0})
        await ms.acknowledge()
        await ms.status(A, ReplicaState.FAILED)
        await ms.put(B, 100)
        await ms.put(A, 0)
        await ms.until(lambda: B in ms.assigned())
        await ms.acknowledge()
        # B has not caught up (no status yet), but A failed: the move goes ahead.
        await ms.until(lambda: ms.assigned() == {B: 0})
