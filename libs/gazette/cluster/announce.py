"""Route announcements: a primary that synced every replica under its item's route
writes that route into each of the item's assignments, which is what the allocator's
consistency check (`gazette.allocator.route_consistent`) reads before it removes a
replica.

Many items sync at once when members join or many items are created, so announcements
are batched: whatever is queued when a transaction goes out shares it (each item's keys
guarded by their mod revisions), instead of one etcd transaction, and one watch event for
every member, per item.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from gazette.allocator import Route, assignments_of, route_of
from gazette.keyspace import Etcd, EtcdError, KeySpace, Layout, Txn, TxnConflict

log = logging.getLogger(__name__)

#: Keys written per transaction (etcd's default limit is 128 operations, and every
#: written key is compared too).
MAX_KEYS = 60


class Announcer:
    """Batches announcements of `keyspace`'s items into etcd transactions; run
    `run()` as a task."""

    def __init__(self, etcd: Etcd, keyspace: KeySpace[Any], layout: Layout) -> None:
        self.etcd, self.keyspace, self.layout = etcd, keyspace, layout
        self._queue: dict[str, tuple[Route, asyncio.Future[bool]]] = {}
        self._wake = asyncio.Event()

    async def announce(self, item: str, route: Route) -> bool:
        """Write `route` into every assignment of `item` if the assignments still
        make that route; returns whether they now hold it. Raises `EtcdError` if etcd
        failed."""
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        old = self._queue.get(item)
        if old is not None and not old[1].done():
            old[1].set_result(False)  # superseded by the newer announcement
        self._queue[item] = (route, fut)
        self._wake.set()
        return await fut

    async def run(self) -> None:
        """Until cancelled: write what is queued, a transaction at a time."""
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                queued, self._queue = self._queue, {}
                while queued:
                    queued = await self._write(queued)
        finally:
            stopped = EtcdError("route announcements stopped (the member is stopping, or "
                                "they restart)")
            for _, fut in self._queue.values():
                if not fut.done():
                    fut.set_exception(stopped)

    async def _write(self, queued: dict[str, tuple[Route, asyncio.Future[bool]]]
                     ) -> dict[str, tuple[Route, asyncio.Future[bool]]]:
        """One transaction of as many queued items as fit; returns those left."""
        txn, batch, rest = Txn(), [], {}
        for item, (route, fut) in queued.items():
            if fut.done():
                continue
            if len(txn) >= MAX_KEYS:
                rest[item] = (route, fut)
                continue
            assigned = assignments_of(self.keyspace, self.layout, item)
            if route_of(assigned) != route:
                fut.set_result(False)  # the assignments moved on: a new route comes
                continue
            value = route.encode()
            stale = [a for a in assigned if a.value != value]
            if not stale:
                fut.set_result(True)
                continue
            for a in stale:
                entry = self.keyspace.get(a.key)
                txn.expect(a.key, a.mod_revision).put(
                    a.key, value, lease=entry.kv.lease if entry is not None else 0)
            batch.append((item, route, fut, {a.key for a in stale}))
        if not batch:
            return rest
        try:
            result = await txn.commit(self.etcd)
        except TxnConflict as err:
            # Journals whose keys moved on answer False (they sync again); the others
            # go in the next transaction.
            moved = {key for key, _, _ in err.stale}
            for item, route, fut, keys in batch:
                if keys & moved:
                    fut.set_result(False)
                else:
                    rest[item] = (route, fut)
            with contextlib.suppress(TimeoutError):
                await self.keyspace.wait_for_revision(err.revision, timeout=10)
            return rest
        except Exception as err:  # noqa: BLE001 - handed to the waiting replicas
            for _, _, fut, _ in batch:
                if not fut.done():
                    fut.set_exception(err)
            return rest
        except BaseException:
            for _, _, fut, _ in batch:
                if not fut.done():
                    fut.set_exception(EtcdError("route announcements stopped"))
            raise
        with contextlib.suppress(TimeoutError):  # committed: the mirror catches up later
            await self.keyspace.wait_for_revision(result.revision, timeout=10)
        for item, route, fut, _ in batch:
            log.info("%s: route %s announced", item, route)
            if not fut.done():
                fut.set_result(True)
        return rest
