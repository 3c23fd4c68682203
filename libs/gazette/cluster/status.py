"""Replica statuses in etcd: each member writes the state of its replicas of items
(``{root}/status/{item}#{zone}#{suffix}``, `gazette.protocol.ReplicaStatus`) under its
own lease, so every member, ``gazctl`` and the operator see any shard's state, and a dead
member's statuses vanish with it.

States change in bursts (a member joining takes many shards at once), so writes are
coalesced: only the latest status of an item is written, many items per transaction.
A failed write is retried with backoff; the newest status always wins.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client import Counter

from gazette.allocator import Assignment, IsConsistent, route_consistent
from gazette.keyspace import Etcd, EtcdError, KeySpace, Layout, Txn, TxnConflict
from gazette.protocol import ProcessId, ReplicaState, ReplicaStatus

log = logging.getLogger(__name__)

#: Keys per transaction (etcd's default limit is 128 operations).
MAX_KEYS = 100
RETRY_MAX_SECONDS = 5.0
#: Deadline of one write.
WRITE_SECONDS = 10.0

STATUS_WRITES = Counter("gazette_status_writes_total", "Replica statuses written to etcd")
STATUS_WRITE_ERRORS = Counter("gazette_status_write_errors_total",
                              "Failed writes of replica statuses (retried)")


class StatusWriter:
    """Writes member `me`'s replica statuses under the lease `lease_id()` names; run
    `run()` as a task. `set(item, None)` removes the item's status (it moved away)."""

    def __init__(self, etcd: Etcd, layout: Layout, me: ProcessId,
                 lease_id: Callable[[], int]) -> None:
        self.etcd, self.layout, self.me = etcd, layout, me
        self._lease_id = lease_id
        self._pending: dict[str, ReplicaStatus | None] = {}
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    def set(self, item: str, status: ReplicaStatus | None) -> None:
        self._pending[item] = status
        self._idle.clear()
        self._wake.set()

    async def flushed(self) -> None:
        """Wait until every status set so far is written."""
        await self._idle.wait()

    async def run(self) -> None:
        """Until cancelled: write what is pending, retrying failed writes."""
        delay = 0.1
        while True:
            if not self._pending:
                self._idle.set()
                await self._wake.wait()
            self._wake.clear()
            batch = dict(list(self._pending.items())[:MAX_KEYS])
            for item in batch:
                del self._pending[item]
            try:
                await self._write(batch)
                delay = 0.1
            except (EtcdError, TxnConflict, TimeoutError) as err:
                # (a conflict: this member's lease is gone; the member stops anyway)
                STATUS_WRITE_ERRORS.inc()
                log.warning("writing %d replica statuses failed (retried in %.1f s): %s",
                            len(batch), delay, err or "timed out")
                for item, status in batch.items():  # newer statuses win
                    self._pending.setdefault(item, status)
                await asyncio.sleep(delay)  # backoff before the retry
                delay = min(delay * 2, RETRY_MAX_SECONDS)

    async def _write(self, batch: dict[str, ReplicaStatus | None]) -> None:
        txn, lease = Txn(), self._lease_id()
        for item, status in batch.items():
            key = self.layout.status_key(item, self.me.zone, self.me.suffix)
            if status is None:
                txn.delete(key)
            else:
                txn.put(key, status.encode(), lease=lease)
        async with asyncio.timeout(WRITE_SECONDS):
            await txn.commit(self.etcd)
        STATUS_WRITES.inc(len(batch))


def status_consistent(keyspace: KeySpace[Any], layout: Layout) -> IsConsistent:
    """The allocator's consistency check for items whose replicas report statuses
    (shards): a replica is consistent when it acknowledged the item's route and is ready
    (STANDBY, PRIMARY, or FAILED: a failed replica holds nothing back), or when the
    item's primary failed (so the allocator may move it). An item therefore keeps a
    leaving primary until its successor has caught up: a drain hands a shard to a ready
    standby, and with no standby the allocator adds one first and waits for it."""

    def state(a: Assignment) -> ReplicaState:
        entry = keyspace.get(layout.status_key(a.item, a.member.zone, a.member.suffix))
        if entry is None or not isinstance(entry.value, ReplicaStatus):
            return ReplicaState.PENDING
        return entry.value.state

    def consistent(item: str, assignment: Assignment,
                   assignments: Sequence[Assignment]) -> bool:
        if not route_consistent(item, assignment, assignments):
            return False
        primary = next((a for a in assignments if a.slot == 0), None)
        if primary is not None and state(primary) == ReplicaState.FAILED:
            return True
        return state(assignment) >= ReplicaState.STANDBY

    return consistent
