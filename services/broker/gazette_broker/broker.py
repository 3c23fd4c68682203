"""The broker core: journal specs in etcd become running replicas on this broker.

It follows the cluster's keyspace: when a JournalSpec appears, it opens a `Replica` (the
stores are listed first, so the write head continues after persisted content); when the
spec changes, the replica takes the new revision; when it is deleted, the replica stops
and its open spool is rolled to the persister. A journal whose stores cannot be listed is
not served (its write head is unknown) but named in `unready` with the reason, and tried
again every few seconds; the broker goes on following the keyspace meanwhile. Every
task it starts (the persister, each replica's roll/refresh loop) is owned and cancelled
on `close()`.

In a cluster (`me` given), only journals assigned to this broker get a replica, and
each follows its journal's route (`Replica.update_route`) as assignments change; the
primary announces a route it has synced by writing it into every assignment of the
journal (`announce`), which is what the allocator's consistency check reads. Without
`me`, every journal is served here alone (an embedded single broker).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gazette.allocator import Route, assignments_of, route_of
from gazette.errors import ValidationError
from gazette.fragment import Fragment, FragmentIndex, Persister
from gazette.fragment.store import FragmentStore, StoreError, store_for
from gazette.keyspace import Etcd, Event, KeySpace, Layout, Txn, TxnConflict
from gazette.protocol import JournalSpec, ProcessId
from gazette_broker.pipeline import Channels
from gazette_broker.replica import DEFAULT_MAX_APPEND_SIZE, Peering, Replica
from gazette_broker.resolver import Resolver

log = logging.getLogger(__name__)

#: Journals whose stores could not be listed are tried again this often.
OPEN_RETRY_SECONDS = 5
#: New journals opened (their stores listed) at once.
OPEN_CONCURRENCY = 16


class Broker:
    """Replicas of the journals in `keyspace`, with their spools under `spool_root`."""

    def __init__(self, keyspace: KeySpace[Any], layout: Layout, spool_root: Path,
                 file_root: Path | None = None,
                 max_append_size: int = DEFAULT_MAX_APPEND_SIZE,
                 me: ProcessId | None = None, etcd: Etcd | None = None,
                 live: Callable[[], bool] = lambda: True) -> None:
        """`me` and `etcd`: this broker's member id in a cluster (None: a lone broker);
        `live`: whether its member lease is surely held (a primary appends only then)."""
        self.keyspace, self.layout = keyspace, layout
        self.me, self.etcd = me, etcd
        self.channels = Channels()
        self.resolver = Resolver(keyspace, layout, me) if me is not None else None
        self._peering = Peering(me, self.channels, self.resolver.header, self.announce,
                                live) if me is not None and self.resolver is not None else None
        self.spool_root, self.file_root = spool_root, file_root
        self.max_append_size = max_append_size
        self.index = FragmentIndex()
        self.persister = Persister(on_persisted=self._on_persisted)
        #: One thread summing appends' SHA-1s (their own and their spools') while the
        #: loop receives content and writes spools.
        self.hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="append-sha1")
        self.replicas: dict[str, Replica] = {}
        #: Journals with a spec that are not served yet: why, as a sentence naming them.
        self.unready: dict[str, str] = {}
        self._stores: dict[str, FragmentStore] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._changed = asyncio.Event()
        self._sync_lock = asyncio.Lock()
        self._synced = asyncio.Event()  # replaced by a fresh one after each sync
        self._unobserve: Callable[[], None] = lambda: None

    def _on_persisted(self, fragment: Fragment) -> None:
        self.index.add_local(fragment)
        replica = self.replicas.get(fragment.journal)
        if replica is not None:
            replica.persisted(fragment)

    def store_for(self, url: str) -> FragmentStore:
        store = self._stores.get(url)
        if store is None:
            store = self._stores[url] = store_for(url, file_root=self.file_root)
        return store

    async def start(self) -> None:
        """Open replicas for the journals known now, and follow changes."""
        leftovers = await asyncio.to_thread(_leftover_spools, self.spool_root)
        if leftovers:
            log.warning("%d spool files (%d bytes) are left in %s by an earlier broker that "
                        "did not stop cleanly; they are not recovered (replicas on other "
                        "brokers hold what was acknowledged) and may be removed",
                        len(leftovers), sum(size for _, size in leftovers), self.spool_root)
        self._tasks["persister"] = asyncio.create_task(self.persister.run(), name="persister")
        self._unobserve = self.keyspace.observe(self._on_change)
        await self.sync()
        self._tasks["sync"] = asyncio.create_task(self._follow(), name="broker-sync")

    def _on_change(self, revision: int, events: list[Event]) -> None:
        if self.me is not None or any(ev.kv.key.startswith(self.layout.items)
                                      for ev in events):
            self._changed.set()

    async def _follow(self) -> None:
        while True:
            # Journals that could not be opened are tried again now and then.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(OPEN_RETRY_SECONDS if self.unready else None):
                    await self._changed.wait()
            self._changed.clear()
            await self.sync()

    async def _open(self, spec: JournalSpec, gate: asyncio.Semaphore) -> None:
        """Open and start serving `spec`'s journal; if its stores cannot be listed, it
        is not served (its write head is unknown) and `unready` says why."""
        name = spec.name
        async with gate:
            try:
                replica = await Replica.open(
                    spec, self.spool_root / name.replace("/", "%2F"), self.index,
                    self.persister, self.store_for, self.max_append_size, self.hasher,
                    self._peering)
            except (StoreError, ValidationError, OSError) as err:
                reason = (f"journal {name} is not served yet: its fragment stores cannot "
                          f"be listed: {err}")
                if self.unready.get(name) != reason:
                    log.warning("%s (trying again every %d s)", reason, OPEN_RETRY_SECONDS)
                self.unready[name] = reason
                return
        self.unready.pop(name, None)
        if self.resolver is not None:
            replica.update_route(self.resolver.resolve(name))
        self.replicas[name] = replica
        self._tasks[f"replica:{name}"] = asyncio.create_task(replica.run(),
                                                             name=f"replica:{name}")
        log.info("serving %s from offset %d", name, replica.write_head)

    async def sync(self) -> None:
        """Bring replicas in line with the specs in the keyspace. New journals are opened
        a few at a time, so that one slow store does not hold up the others."""
        async with self._sync_lock:
            specs = {e.value.name: e.value for e in self.keyspace.prefixed(self.layout.items)
                     if isinstance(e.value, JournalSpec)}
            declared = set(specs)
            if self.resolver is not None:
                assigned = self.resolver.assigned()
                specs = {name: spec for name, spec in specs.items() if name in assigned}
            gate = asyncio.Semaphore(OPEN_CONCURRENCY)
            async with asyncio.TaskGroup() as tg:
                for name, spec in specs.items():
                    replica = self.replicas.get(name)
                    if replica is None:
                        tg.create_task(self._open(spec, gate))
                        continue
                    if replica.spec != spec:
                        replica.update_spec(spec)
                    if self.resolver is not None:
                        replica.update_route(self.resolver.resolve(name))
            for name in [n for n in self.unready if n not in specs]:
                del self.unready[name]
            for name in [n for n in self.replicas if n not in specs]:
                replica = self.replicas[name]
                if self.resolver is not None:  # ends a primary's session with it
                    replica.update_route(self.resolver.resolve(name))
                await self._stop(f"replica:{name}")
                await replica.roll()  # hand the open spool to the persister
                del self.replicas[name]
                log.info("stopped serving %s (%s)", name,
                         "unassigned" if name in declared else "spec deleted")
            self._synced.set()
            self._synced = asyncio.Event()

    async def announce(self, journal: str, route: Route) -> bool:
        """Write `route` into every assignment of `journal` (the primary has synced
        every replica under it), if the assignments still make that route. Returns
        whether they now hold it."""
        assert self.etcd is not None, "a broker in a cluster has etcd"
        assigned = assignments_of(self.keyspace, self.layout, journal)
        if route_of(assigned) != route:
            return False
        value = route.encode()
        txn = Txn()
        for a in assigned:
            if a.value != value:
                entry = self.keyspace.get(a.key)
                lease = entry.kv.lease if entry is not None else 0
                txn.expect(a.key, a.mod_revision).put(a.key, value, lease=lease)
        if not len(txn):
            return True
        try:
            result = await txn.commit(self.etcd)
        except TxnConflict:
            return False  # the assignments moved on: a new route comes
        await self.keyspace.wait_for_revision(result.revision)
        log.info("%s: route %s announced", journal, route)
        return True

    async def wait_serving(self, journals: set[str]) -> None:
        """Return once every one of `journals` has a replica here."""
        while not journals <= self.replicas.keys():
            await self._synced.wait()

    def persister_backlog(self) -> bool:
        """Whether closed spools are still waiting to be persisted."""
        return not self.persister.idle

    async def _stop(self, key: str) -> None:
        """Cancel an owned task and wait until it has finished."""
        task = self._tasks.pop(key, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def close(self, drain_timeout: float = 30.0) -> None:
        """Stop following etcd, roll every spool, wait (bounded) for the persister to
        upload them, and stop every task."""
        self._unobserve()
        for key in [k for k in self._tasks if k != "persister"]:
            await self._stop(key)
        for replica in self.replicas.values():
            await replica.roll()
        self.persister.flush()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.persister.wait_idle(), drain_timeout)
        await self._stop("persister")
        for store in self._stores.values():
            await store.close()
        await self.channels.close()
        self.hasher.shutdown(wait=False)  # its work is awaited by the appends


def _leftover_spools(root: Path) -> list[tuple[Path, int]]:
    if not root.is_dir():
        return []
    return [(p, p.stat().st_size) for p in root.rglob("spool-*") if p.is_file()]
