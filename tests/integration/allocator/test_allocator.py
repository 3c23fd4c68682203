"""The allocator over a real etcd: members under leases, the oldest leads and writes
assignments; leadership passes when the leader goes; a member that dies takes its
assignments with it and they are placed elsewhere; an exiting member is drained, its
assignments removed only once their items are consistent."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from gazette.allocator import Allocator, Assignment, read_state
from gazette.keyspace import Etcd, KeySpace, Layout, Lease, TxnConflict
from gazette.keyspace.specs import Decoder, apply_changes, encode_broker
from gazette.protocol import MemberSpec, ProcessId
from gazette.protocol.trees import journal_changes_from_yaml

pytestmark = pytest.mark.integration

SPECS = """
name: alloc/
replication: 3
fragment: {length: 1048576, compression_codec: NONE, stores: ["file:///"]}
children:
  - name: alloc/a
  - name: alloc/b
  - name: alloc/c
  - name: alloc/d
  - name: alloc/pair
    replication: 2
  - name: alloc/single
    replication: 1
"""
REPLICATION = {"alloc/a": 3, "alloc/b": 3, "alloc/c": 3, "alloc/d": 3, "alloc/pair": 2,
               "alloc/single": 1}


@dataclass
class Node:
    """A member: its lease, member key, keyspace and allocator task."""

    id: ProcessId
    lease: Lease
    keyspace: KeySpace[Any]
    allocator: Allocator
    task: asyncio.Task[None]
    consistent: dict[str, bool] = field(default_factory=dict)


@dataclass
class Cluster:
    etcd: Etcd
    layout: Layout
    nodes: list[Node] = field(default_factory=list)

    async def join(self, zone: str, suffix: str, limit: int = 100) -> Node:
        pid = ProcessId(zone, suffix)
        lease = await Lease.grant(self.etcd, 30)
        await self.put_member(pid, lease, limit)
        keyspace: KeySpace[Any] = KeySpace(self.etcd, self.layout.root + "/",
                                           Decoder(self.layout))
        await keyspace.__aenter__()
        flags: dict[str, bool] = {}

        def is_consistent(item: str, a: Assignment, all_: Any) -> bool:
            return flags.get(item, True)

        allocator = Allocator(self.etcd, keyspace, self.layout, pid,
                              is_consistent=is_consistent)
        node = Node(pid, lease, keyspace, allocator,
                    asyncio.create_task(allocator.run()), flags)
        self.nodes.append(node)
        return node

    async def put_member(self, pid: ProcessId, lease: Lease, limit: int) -> None:
        spec = MemberSpec(pid, f"http://{pid.suffix}.test:8080", limit)
        await self.etcd.put(self.layout.member_key(pid.zone, pid.suffix),
                            encode_broker(spec), lease=lease.id)

    async def leave(self, node: Node) -> None:
        """The member dies: its lease ends, with its member key and assignments."""
        await self.stop(node)
        await self.etcd.lease_revoke(node.lease.id)

    async def stop(self, node: Node) -> None:
        node.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await node.task
        await node.keyspace.__aexit__(None, None, None)
        self.nodes.remove(node)

    def assignments(self, node: Node | None = None) -> dict[str, list[ProcessId]]:
        ks = (node or self.nodes[0]).keyspace
        state = read_state(ks, self.layout, lambda spec: int(spec.replication))
        return state.current()

    async def until(self, check: Callable[[], bool], timeout: float = 15.0) -> None:
        """Poll `check` under a deadline (it reads the keyspaces, which change under
        their watch)."""
        async with asyncio.timeout(timeout):
            while not check():  # noqa: ASYNC110 - polling a mirror, not waiting on an event
                await asyncio.sleep(0.02)


@pytest.fixture
async def cluster(etcd: Etcd, etcd_prefix: str) -> AsyncIterator[Cluster]:
    c = Cluster(etcd, Layout(etcd_prefix))
    await apply_changes(etcd, c.layout, journal_changes_from_yaml(SPECS))
    try:
        yield c
    finally:
        for node in list(c.nodes):
            await c.stop(node)


def placed_well(assignments: dict[str, list[ProcessId]], members: set[ProcessId]) -> bool:
    """Every item fully replicated (as far as members allow), on live members, and in
    two zones whenever it has two replicas and two zones exist."""
    zones = {m.zone for m in members}
    for item, r in REPLICATION.items():
        ms = assignments.get(item, [])
        if len(ms) != min(r, len(members)) or not set(ms) <= members or len(set(ms)) != len(ms):
            return False
        if len(ms) >= 2 and len(zones) >= 2 and len({m.zone for m in ms}) < 2:
            return False
    return True


async def test_the_oldest_member_leads_and_places_every_item(cluster: Cluster) -> None:
    a = await cluster.join("z1", "a")
    b = await cluster.join("z1", "b")
    c = await cluster.join("z2", "c")
    members = {a.id, b.id, c.id}
    await cluster.until(lambda: placed_well(cluster.assignments(), members))
    await asyncio.wait_for(a.allocator.converged.wait(), 10)
    assert a.allocator.state().leader == a.id
    assert not b.allocator.converged.is_set() and not c.allocator.converged.is_set()
    # Primaries are spread, and every member sees the same assignments.
    primaries = [ms[0] for ms in cluster.assignments().values()]
    assert len(set(primaries)) == 3
    for node in (b, c):
        await cluster.until(lambda n=node: cluster.assignments(n) == cluster.assignments(a))

    # The leader dies: its assignments go with its lease; the next oldest leads and
    # places them again.
    await cluster.leave(a)
    members = {b.id, c.id}
    await cluster.until(lambda: placed_well(cluster.assignments(), members))
    assert b.allocator.state().leader == b.id
    await asyncio.wait_for(b.allocator.converged.wait(), 10)


async def test_an_exiting_member_is_drained_once_items_are_consistent(
    cluster: Cluster,
) -> None:
    a = await cluster.join("z1", "a")
    b = await cluster.join("z2", "b")
    await cluster.until(lambda: placed_well(cluster.assignments(), {a.id, b.id}))
    c = await cluster.join("z2", "c")
    await cluster.until(lambda: placed_well(cluster.assignments(), {a.id, b.id, c.id}))
    held = [item for item, ms in cluster.assignments().items() if b.id in ms]
    assert held

    # b is exiting (limit 0). Its items are not consistent yet: replacements are added,
    # b's assignments stay.
    for item in REPLICATION:
        a.consistent[item] = False
    await cluster.put_member(b.id, b.lease, 0)
    replaced = [item for item in held if REPLICATION[item] <= 2]
    assert replaced  # items with fewer replicas than members get another member

    def others_added() -> bool:
        now = cluster.assignments()
        return all(len(now[item]) > min(REPLICATION[item], 2) for item in replaced)

    await cluster.until(others_added)
    assert all(b.id in cluster.assignments()[item] for item in held)

    # Consistent now (as a member acknowledging its route would show): b is drained.
    for item in REPLICATION:
        a.consistent[item] = True
    await cluster.put_member(a.id, a.lease, 100)  # a keyspace change wakes the leader
    await cluster.until(lambda: not any(b.id in ms for ms in cluster.assignments().values()))
    assert placed_well(cluster.assignments(), {a.id, c.id})


async def test_a_lease_expiring_before_the_commit_is_a_conflict(
        etcd: Etcd, etcd_prefix: str) -> None:
    """Issue 34, item 18: a member's lease expires between the leader's read and its
    commit (the assignments it writes name that lease): a conflict, re-planned from the
    revision where the member is gone, not an error that restarts the allocator."""
    layout = Layout(etcd_prefix)
    await apply_changes(etcd, layout, journal_changes_from_yaml(SPECS))
    leases = [await Lease.grant(etcd, 30) for _ in range(2)]
    ids = [ProcessId("z1", "a"), ProcessId("z2", "b")]
    for pid, lease in zip(ids, leases, strict=True):
        spec = MemberSpec(pid, f"http://{pid.suffix}.test:8080", 100)
        await etcd.put(layout.member_key(pid.zone, pid.suffix), encode_broker(spec),
                       lease=lease.id)
    # The leader's view, read before b's lease ends (loaded once: it does not follow).
    keyspace: KeySpace[Any] = KeySpace(etcd, layout.root + "/", Decoder(layout))
    await keyspace.load()
    assert len(keyspace.prefixed(layout.members)) == 2
    gone = await etcd.put(f"{etcd_prefix}-mark", b"")  # a revision before b's end
    await etcd.lease_revoke(leases[1].id)
    allocator = Allocator(etcd, keyspace, layout, ids[0])
    with pytest.raises(TxnConflict, match="lease") as err:
        await allocator.converge()
    assert err.value.revision > gone  # b's keys are gone there: re-plan from it
    await etcd.lease_revoke(leases[0].id)
