"""The broker core: journal specs in etcd become running replicas on this broker.

It follows the cluster's keyspace incrementally: each change marks the journals it
touches (a spec, an assignment; a member's endpoint touches the journals served here),
and only those are brought in line, so one change costs the same with ten or ten
thousand journals. When a journal is to be served here, a `Replica` is opened (the
stores are listed first, so the write head continues after persisted content); when its
spec changes, the replica takes the new revision; when it is deleted or moved away, the
replica closes (its open spool goes to the persister). A journal whose stores cannot be
listed is not served (its write head is unknown) but named in `unready` with the reason,
and tried again every few seconds.

Every task it starts (the persister, route announcements, each replica's loop and
opening) is owned by its `Supervisor`: restarted with backoff after transient errors,
fatal to the broker after any other (`BrokerServer.wait` then raises).

In a cluster (`me` given), only journals assigned to this broker get a replica, and
each follows its journal's route (`Replica.update_route`) as assignments change; the
primary announces a route it has synced (`Announcer`), which is what the allocator's
consistency check reads. Without `me`, every journal is served here alone (an embedded
single broker).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gazette.errors import ValidationError
from gazette.fragment import Persister
from gazette.fragment.cache import FragmentCache
from gazette.fragment.persister import DEFAULT_MAX_PENDING_BYTES
from gazette.fragment.store import FragmentStore, StoreError, store_for
from gazette.keyspace import Etcd, EtcdError, Event, KeySpace, Layout
from gazette.protocol import JournalSpec, ProcessId
from gazette.supervise import Supervisor
from gazette_broker.announce import Announcer
from gazette_broker.pipeline import Channels
from gazette_broker.primary import Peering
from gazette_broker.replica import (
    CLOSED_DELETED,
    DEFAULT_APPEND_IDLE_TIMEOUT,
    DEFAULT_MAX_APPEND_SIZE,
    Replica,
    Shared,
)
from gazette_broker.resolver import Resolver

log = logging.getLogger(__name__)

#: Journals whose stores could not be listed are tried again this often.
OPEN_RETRY_SECONDS = 5
#: New journals opened (their stores listed) at once.
OPEN_CONCURRENCY = 16
#: Bytes of persisted fragments cached on local disk for readers, broker-wide.
DEFAULT_CACHE_BYTES = 1 << 30


class Broker:
    """Replicas of the journals in `keyspace`, with their spools under `spool_root`."""

    def __init__(self, keyspace: KeySpace[Any], layout: Layout, spool_root: Path,
                 file_root: Path | None = None,
                 max_append_size: int = DEFAULT_MAX_APPEND_SIZE,
                 me: ProcessId | None = None, etcd: Etcd | None = None,
                 live: Callable[[], bool] = lambda: True, *,
                 cache_bytes: int = DEFAULT_CACHE_BYTES,
                 max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
                 append_idle_timeout: float = DEFAULT_APPEND_IDLE_TIMEOUT) -> None:
        """`me` and `etcd`: this broker's member id in a cluster (None: a lone broker);
        `live`: whether its member lease is surely held (a primary appends only then)."""
        self.keyspace, self.layout = keyspace, layout
        self.me, self.etcd = me, etcd
        self.channels = Channels()
        self.resolver = Resolver(keyspace, layout, me) if me is not None else None
        self.announcer = Announcer(etcd, keyspace, layout) if etcd is not None else None
        peering = None
        if me is not None and self.resolver is not None and self.announcer is not None:
            peering = Peering(me, self.channels, self.resolver.header,
                              self.announcer.announce, live)
        self.spool_root, self.file_root = spool_root, file_root
        self.max_append_size = max_append_size
        self.persister = Persister(max_pending_bytes=max_pending_bytes)
        #: One thread summing appends' SHA-1s (their own and their spools') while the
        #: loop receives content and writes spools.
        self.hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="append-sha1")
        self.shared = Shared(self.persister, self.store_for,
                             FragmentCache(spool_root / ".cache", cache_bytes), self.hasher,
                             peering, max_append_size, append_idle_timeout)
        self.supervisor = Supervisor(transient=(EtcdError, StoreError, OSError))
        self.replicas: dict[str, Replica] = {}
        #: Journals with a spec that are not served yet: why, as a sentence naming them.
        self.unready: dict[str, str] = {}
        self._stores: dict[str, FragmentStore] = {}
        self._opening: set[str] = set()
        self._closing: dict[str, asyncio.Task[None]] = {}
        self._gate = asyncio.Semaphore(OPEN_CONCURRENCY)
        self._dirty: set[str] = set()
        self._changed = asyncio.Event()
        self._served = asyncio.Event()  # replaced by a fresh one when a replica opens
        self._unobserve: Callable[[], None] = lambda: None

    def store_for(self, url: str) -> FragmentStore:
        store = self._stores.get(url)
        if store is None:
            store = self._stores[url] = store_for(url, file_root=self.file_root)
        return store

    async def start(self) -> None:
        """Open replicas for the journals known now, and follow changes."""
        leftovers = await asyncio.to_thread(_leftover_spools, self.spool_root)
        if leftovers:
            self._report_leftovers(leftovers)
        self.supervisor.spawn("persister", self.persister.run, transient=())
        if self.announcer is not None:
            self.supervisor.spawn("announcer", self.announcer.run)
        self._unobserve = self.keyspace.observe(self._on_change)
        self._dirty |= {e.value.name for e in self.keyspace.prefixed(self.layout.items)
                        if isinstance(e.value, JournalSpec)}
        await self._sync(self._take_dirty())
        self.supervisor.spawn("broker-sync", self._follow, transient=())

    def _report_leftovers(self, leftovers: list[tuple[Path, int]]) -> None:
        """Say what spool files left by a broker that did not stop cleanly mean: they
        are not recovered; what other replicas acknowledged is safe there, but content
        only they held (journals of replication 1) is lost."""
        alone: dict[str, int] = {}
        held = 0
        for path, size in leftovers:
            journal = urllib.parse.unquote(path.parent.name)
            spec = self._spec(journal)
            if spec is None or spec.replication == 1:
                alone[journal] = alone.get(journal, 0) + size
            else:
                held += size
        if alone:
            log.error("spool files left by an earlier broker that did not stop cleanly "
                      "held %d bytes of journals of replication 1 or deleted journals "
                      "(%s) that were not persisted: that content is lost. The files "
                      "are not recovered and may be removed from %s.", sum(alone.values()),
                      ", ".join(sorted(alone)[:10]) + (", ..." if len(alone) > 10 else ""),
                      self.spool_root)
        if held:
            log.warning("spool files of replicated journals (%d bytes) are left in %s by "
                        "an earlier broker that did not stop cleanly: they are not "
                        "recovered (the journals' other replicas hold what was "
                        "acknowledged) and may be removed", held, self.spool_root)

    def _on_change(self, revision: int, events: list[Event]) -> None:
        items, assigned = self.layout.items, self.layout.assignments
        for ev in events:
            key = ev.kv.key
            if key.startswith(items):
                self._dirty.add(key[len(items):])
            elif self.me is None:
                continue
            elif key.startswith(assigned):
                self._dirty.add(key[len(assigned):].rsplit("#", 3)[0])
            elif key.startswith(self.layout.members):
                self._dirty |= self.replicas.keys()  # endpoints of their routes
        if self._dirty:
            self._changed.set()

    def _take_dirty(self) -> set[str]:
        dirty, self._dirty = self._dirty, set()
        self._changed.clear()
        return dirty

    async def _follow(self) -> None:
        while True:
            await self._changed.wait()
            await self._sync(self._take_dirty())

    def _retry_later(self, name: str) -> None:
        """Try to open `name` again in a while (its stores could not be listed)."""

        def retry() -> None:
            self._dirty.add(name)
            self._changed.set()

        asyncio.get_running_loop().call_later(OPEN_RETRY_SECONDS, retry)

    def _spec(self, name: str) -> JournalSpec | None:
        entry = self.keyspace.get(self.layout.item_key(name))
        return entry.value if entry is not None and isinstance(entry.value, JournalSpec) \
            else None

    def _wanted(self, name: str) -> JournalSpec | None:
        """The spec of `name` if this broker should serve it now."""
        spec = self._spec(name)
        if spec is None or (self.resolver is not None and not self.resolver.is_assigned(name)):
            return None
        return spec

    async def sync(self) -> None:
        """Bring every journal in line with the keyspace (start-up does this; changes
        are followed incrementally after)."""
        names = {e.value.name for e in self.keyspace.prefixed(self.layout.items)
                 if isinstance(e.value, JournalSpec)}
        await self._sync(names | self.replicas.keys() | self.unready.keys())

    async def _sync(self, names: set[str]) -> None:
        for name in names:
            spec = self._wanted(name)
            replica = self.replicas.get(name)
            if spec is None:
                self.unready.pop(name, None)
                if replica is not None:
                    self._remove(name, replica)
                continue
            if replica is None:
                if name not in self._opening:
                    self._opening.add(name)
                    self.supervisor.spawn(f"open:{name}", functools.partial(self._open, name),
                                          kind="open", transient=())
                continue
            if replica.spec != spec:
                replica.update_spec(spec)
            if self.resolver is not None:
                replica.update_route(self.resolver.resolve(name, announced=True))

    async def _open(self, name: str) -> None:
        """Open and start serving `name`'s journal; if its stores cannot be listed, it
        is not served (its write head is unknown) and `unready` says why."""
        try:
            closing = self._closing.get(name)
            if closing is not None:  # its last replica here is still closing
                await asyncio.shield(closing)
            async with self._gate:
                spec = self._wanted(name)
                if spec is None:
                    return
                try:
                    replica = await Replica.open(
                        spec, self.spool_root / name.replace("/", "%2F"), self.shared)
                except (StoreError, ValidationError, OSError) as err:
                    reason = (f"journal {name} is not served yet: its fragment stores "
                              f"cannot be listed: {err}")
                    if self.unready.get(name) != reason:
                        log.warning("%s (trying again every %d s)", reason,
                                    OPEN_RETRY_SECONDS)
                    self.unready[name] = reason
                    self._retry_later(name)
                    return
        finally:
            self._opening.discard(name)
        self.unready.pop(name, None)
        self.replicas[name] = replica
        self._dirty.add(name)  # the spec and route of now
        self._changed.set()
        self.supervisor.spawn(f"replica:{name}", replica.run, kind="replica")
        self._served.set()
        self._served = asyncio.Event()
        log.info("serving %s from offset %d", name, replica.write_head)

    def _remove(self, name: str, replica: Replica) -> None:
        """Stop serving `name` here: its replica closes in the background (it may wait
        for an append in progress), owned until done."""
        del self.replicas[name]
        deleted = self._spec(name) is None
        if self.resolver is not None:  # ends a primary's sessions with it
            replica.update_route(self.resolver.resolve(name, announced=True))

        async def close() -> None:
            await self.supervisor.stop(f"replica:{name}")
            await replica.close(CLOSED_DELETED if deleted else "no longer assigned here")
            log.info("stopped serving %s (%s)", name, replica.closed)

        task = asyncio.create_task(close(), name=f"close:{name}")
        self._closing[name] = task
        task.add_done_callback(lambda t: self._closed(name, t))

    def _closed(self, name: str, task: asyncio.Task[None]) -> None:
        if self._closing.get(name) is task:
            del self._closing[name]
        if not task.cancelled() and task.exception() is not None:
            log.error("closing the replica of %s failed", name, exc_info=task.exception())

    async def wait_serving(self, journals: set[str]) -> None:
        """Return once every one of `journals` has a replica here."""
        while not journals <= self.replicas.keys():
            await self._served.wait()

    async def wait_closed(self) -> None:
        """Return once replicas being closed now are closed (their spools handed to
        the persister)."""
        while self._closing:
            await asyncio.gather(*self._closing.values(), return_exceptions=True)

    def persister_backlog(self) -> bool:
        """Whether closed spools are still waiting to be persisted."""
        return not self.persister.idle

    async def close(self, drain_timeout: float = 30.0) -> None:
        """Stop following etcd, close every replica (rolling its spool to the
        persister), wait (bounded) for the persister to upload them, and stop every
        task."""
        self._unobserve()
        if self.resolver is not None:
            self.resolver.stop()
        await self.supervisor.stop("broker-sync")
        replicas, self.replicas = dict(self.replicas), {}
        for name, replica in replicas.items():
            await self.supervisor.stop(f"replica:{name}")
            await replica.close("the broker is stopping")
        await asyncio.gather(*self._closing.values(), return_exceptions=True)
        self.persister.flush()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.persister.wait_idle(), drain_timeout)
        await self.supervisor.close()
        for store in self._stores.values():
            await store.close()
        await self.channels.close()
        self.hasher.shutdown(wait=False)  # its work is awaited by the appends


def _leftover_spools(root: Path) -> list[tuple[Path, int]]:
    if not root.is_dir():
        return []
    return [(p, p.stat().st_size) for p in root.rglob("spool-*") if p.is_file()]
