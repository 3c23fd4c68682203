"""The broker core: journal specs in etcd become running replicas on this broker.

The cluster layer does the following (`gazette.cluster.LocalItems`): journals to be
served here get a `Replica` (opened after its stores are listed, so the write head
continues after persisted content), which takes each new spec and route; a journal
deleted or moved away has its replica closed (its open spool goes to the persister). A
journal whose stores cannot be listed is not served (its write head is unknown) but
named in `unready` with the reason, and tried again every few seconds.

Every task it starts (the persister, route announcements, each replica's loop and
opening) is owned by its `Supervisor`: restarted with backoff after transient errors,
fatal to the broker after any other (`BrokerServer.wait` then raises).

In a cluster (`me` given), only journals assigned to this broker get a replica, and
each follows its journal's route (`Replica.update_route`) as assignments change; the
primary announces a route it has synced (`gazette.cluster.Announcer`), which is what the
allocator's consistency check reads. Without `me`, every journal is served here alone
(an embedded single broker).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gazette.cluster import Announcer, Channels, LocalItems, NotReady, Resolver
from gazette.errors import ValidationError
from gazette.fragment import DEFAULT_MAX_PENDING_BYTES, FragmentCache, Persister
from gazette.fragment.store import FragmentStore, StoreError, store_for
from gazette.keyspace import Etcd, EtcdError, KeySpace, Layout
from gazette.protocol import JournalSpec, ProcessId
from gazette.supervise import Supervisor
from gazette_broker.replica import (
    DEFAULT_APPEND_IDLE_TIMEOUT,
    DEFAULT_MAX_APPEND_SIZE,
    Replica,
    Shared,
)
from gazette_broker.replica_state import Peering

log = logging.getLogger(__name__)

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
                 append_idle_timeout: float = DEFAULT_APPEND_IDLE_TIMEOUT,
                 channels: Channels | None = None) -> None:
        """`me` and `etcd`: this broker's member id in a cluster (None: a lone broker);
        `live`: whether its member lease is surely held (a primary appends only then);
        `channels` to other brokers (their TLS, this broker's own token)."""
        self.keyspace, self.layout = keyspace, layout
        self.me, self.etcd = me, etcd
        self.channels = channels if channels is not None else Channels()
        self.resolver = Resolver(keyspace, layout, me, JournalSpec) if me is not None \
            else None
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
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spool-write")
        self.shared = Shared(self.persister, self.store_for,
                             FragmentCache(spool_root / ".cache", cache_bytes), self.hasher,
                             self.writer, peering, max_append_size, append_idle_timeout)
        self.supervisor = Supervisor(transient=(EtcdError, StoreError, OSError))
        self.local: LocalItems[JournalSpec, Replica] = LocalItems(
            keyspace, layout, JournalSpec, self._open, self.supervisor,
            resolver=self.resolver, kind="replica")
        #: The replicas served here, by journal.
        self.replicas: dict[str, Replica] = self.local.items
        #: Journals with a spec that are not served yet: why, as a sentence naming them.
        self.unready: dict[str, str] = self.local.unready
        self._stores: dict[str, FragmentStore] = {}

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
        await self.local.start()

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

    def _spec(self, name: str) -> JournalSpec | None:
        return self.local.spec(name)

    async def sync(self) -> None:
        """Bring every journal in line with the keyspace (start-up does this; changes
        are followed incrementally after)."""
        await self.local.sync()

    async def _open(self, spec: JournalSpec) -> Replica:
        """A replica of `spec`'s journal; `NotReady` if its stores cannot be listed
        (its write head is unknown)."""
        name = spec.name
        try:
            replica = await Replica.open(
                spec, self.spool_root / name.replace("/", "%2F"), self.shared)
        except (StoreError, ValidationError, OSError) as err:
            raise NotReady(f"journal {name} is not served yet: its fragment stores "
                           f"cannot be listed: {err}") from err
        log.info("serving %s from offset %d", name, replica.write_head)
        return replica

    async def wait_serving(self, journals: set[str]) -> None:
        """Return once every one of `journals` has a replica here."""
        await self.local.wait_serving(journals)

    async def wait_closed(self) -> None:
        """Return once replicas being closed now are closed (their spools handed to
        the persister)."""
        await self.local.wait_closed()

    def persister_backlog(self) -> bool:
        """Whether closed spools are still waiting to be persisted."""
        return not self.persister.idle

    async def close(self, drain_timeout: float = 30.0) -> None:
        """Stop following etcd, close every replica (rolling its spool to the
        persister), wait (bounded) for the persister to upload them, and stop every
        task."""
        if self.resolver is not None:
            self.resolver.stop()
        await self.local.close("the broker is stopping")
        self.persister.flush()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.persister.wait_idle(), drain_timeout)
        await self.supervisor.close()
        for store in self._stores.values():
            await store.close()
        await self.channels.close()
        self.hasher.shutdown(wait=False)  # its work is awaited by the appends
        self.writer.shutdown(wait=False)


def _leftover_spools(root: Path) -> list[tuple[Path, int]]:
    if not root.is_dir():
        return []
    return [(p, p.stat().st_size) for p in root.rglob("spool-*") if p.is_file()]
