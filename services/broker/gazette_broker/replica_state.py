"""What one journal's replica holds, in one object its parts share: the spec, the open
spool and the index, the registers, the lock that serialises appends and peer sessions,
the journal's resolution, why it closed, the closed spools not yet persisted, the gaps
it rolled past, and the broker's shared settings (`Shared`).

It also does the spool work that more than one part needs: rolling (an append or the
flush interval as primary, a proposal as peer, a sync that rolls past peers' fragments),
handing closed spools to the persister, and listing the stores into the index.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Counter

from gazette.allocator import Route
from gazette.cluster import Channels, Resolution
from gazette.fragment import Fragment, FragmentCache, JournalIndex, Persister, Spool
from gazette.fragment.store import FragmentStore
from gazette.labels import LabelSet
from gazette.pb import broker_pb2 as pb
from gazette.protocol import CompressionCodec, JournalSpec, ProcessId

log = logging.getLogger(__name__)

ROLLS = Counter("gazette_broker_fragments_rolled_total", "Spools closed into fragments")

#: Largest append accepted unless the broker is configured otherwise.
DEFAULT_MAX_APPEND_SIZE = 256 << 20
#: An append stream that brings no content for this long is aborted (nothing written):
#: it holds the journal's lock, so a stalled client must not keep it for ever.
DEFAULT_APPEND_IDLE_TIMEOUT = 30.0
#: A peer uploads its copy of a closed fragment this long after closing it, if the
#: primary has not uploaded it by then.
PEER_PERSIST_DELAY = 5.0


@dataclass(frozen=True)
class Peering:
    """What a replica in a cluster needs: who this broker is, channels to its peers, the
    response header of a resolution, and how to announce a synced route (write it into
    the journal's assignments)."""

    me: ProcessId
    channels: Channels
    header: Callable[[Resolution[JournalSpec]], pb.Header]
    announce: Callable[[str, Route], Awaitable[bool]]
    #: Whether this broker's member lease is surely held: a primary whose lease may
    #: have expired takes no appends (another may be primary by now).
    live: Callable[[], bool] = lambda: True


@dataclass
class Shared:
    """What every replica of a broker shares: the persister and stores, one cache of
    persisted fragments (one budget for the broker), the SHA-1 thread, the cluster,
    and the limits of appends. The defaults make a lone replica that persists nothing
    (tests)."""

    persister: Persister | None = None
    store_for: Callable[[str], FragmentStore] | None = None
    cache: FragmentCache | None = None
    #: One thread summing appends' SHA-1s (their own and the spool's) beside the loop;
    #: without it, the loop sums them.
    hasher: Executor | None = None
    #: One thread writing appends into spools, in order, beside the loop (a slow page
    #: cache stalls it, not the reads the loop serves); without it, the loop writes.
    writer: Executor | None = None
    peering: Peering | None = None
    max_append_size: int = DEFAULT_MAX_APPEND_SIZE
    append_idle_timeout: float = DEFAULT_APPEND_IDLE_TIMEOUT


@dataclass
class Gap:
    """Offsets [begin, end) this replica does not hold and its peers do (until they
    persist them): rolled past when it joined the route, or found missing."""

    begin: int
    end: int


class ReplicaState:
    """One journal's replica as its parts (primary, peer, reads) share it."""

    def __init__(self, spec: JournalSpec, spool_dir: Path, shared: Shared,
                 spool: Spool | None = None) -> None:
        self.spec = spec
        self.shared = shared
        self.spool_dir = spool_dir
        spool_dir.mkdir(parents=True, exist_ok=True)
        self.spool = spool or Spool(spec.name, 0, spool_dir, spec.fragment.compression_codec)
        self.index = JournalIndex(spec.name)
        self.registers = LabelSet()
        #: Held by an append, a roll, a pipeline sync or a peer session: one at a time.
        self.lock = asyncio.Lock()
        self.resolution: Resolution[JournalSpec] | None = None
        #: Why the replica was closed ("" while it serves).
        self.closed = ""
        #: Closed spools not yet known persisted: (begin, end) -> local file.
        self.closed_spools: dict[tuple[int, int], Path] = {}
        #: Offsets rolled past (or found missing) that only peers hold, until persisted.
        self.gaps: list[Gap] = []
        self.cache = shared.cache or FragmentCache(spool_dir / "cache")
        #: The spec changed its codec or stores: the spool rolls before the next append.
        self.roll_requested = False
        #: Set (and replaced) whenever the route changes, a peer session starts or the
        #: replica closes: peer sessions then check whether they may go on.
        self.route_changed = asyncio.Event()
        self.pulse = asyncio.Event()  # the primary should sync its pipeline now
        self.reschedule = asyncio.Event()  # the run loop should work out its deadlines again

    @property
    def peering(self) -> Peering | None:
        return self.shared.peering

    @property
    def write_head(self) -> int:
        return self.spool.end

    @property
    def is_primary(self) -> bool:
        """Whether appends are taken here (a lone replica always takes them)."""
        peering = self.shared.peering
        if peering is None:
            return True
        return self.resolution is not None and \
            self.resolution.route.primary_id == peering.me

    def wake_sessions(self) -> None:
        """Have peer sessions check whether they may go on (route changed, a newer
        session came, or the replica closed)."""
        self.route_changed.set()
        self.route_changed = asyncio.Event()

    async def refresh(self, now: float | None = None) -> None:
        """Rebuild the persisted part of the index from a listing of every store. As
        the primary (or alone), also remove fragments older than the spec's retention
        from the stores."""
        store_for = self.shared.store_for
        if store_for is None:
            return
        listed: list[Fragment] = []
        for url in self.spec.fragment.stores:
            listed.extend(await store_for(url).list(self.spec.name))
        retention = self.spec.fragment.retention.total_seconds()
        cutoff, expired = None, []
        if retention:
            cutoff = (time.time() if now is None else now) - retention
            expired = [f for f in listed if f.mod_time and f.mod_time < cutoff]
            if self.is_primary:
                for f in expired:
                    await store_for(f.backing_store).remove(f)
            listed = [f for f in listed if f not in expired]
        self.index.replace_persisted(listed, cutoff, expired)

    async def roll(self) -> Fragment | None:
        """Close the spool (if it holds anything: the closed fragment is returned) and
        start a new one at the write head, with the spec's codec of now."""
        self.roll_requested = False
        old = self.spool
        if old.end == old.begin:
            if old.codec != self.spec.fragment.compression_codec:  # nothing to close, but
                # the next fragment takes the spec's codec of now
                self.spool = await Spool.create(self.spec.name, old.begin, self.spool_dir,
                                                self.spec.fragment.compression_codec)
                await old.remove()
            return None
        # The next spool's file is made first: until it is, `old` stays the open spool.
        new = await Spool.create(self.spec.name, old.end, self.spool_dir,
                                 self.spec.fragment.compression_codec)
        self.close_spool(old)
        self.spool = new
        self.reschedule.set()
        return old.fragment

    async def roll_to(self, begin: int, codec: CompressionCodec | None = None) -> None:
        """Roll, and start the new spool at `begin` (>= the write head); offsets skipped
        are a gap that only peers hold until it is persisted."""
        await self.roll()
        codec = codec or self.spec.fragment.compression_codec
        if (self.spool.begin, self.spool.codec) != (begin, codec):
            if begin > self.spool.begin:
                log.info("%s: rolled to %d; [%d, %d) is held by peers only until they "
                         "persist it", self.spec.name, begin, self.spool.begin, begin)
                self.gaps.append(Gap(self.spool.begin, begin))
            old = self.spool
            self.spool = await Spool.create(self.spec.name, begin, self.spool_dir, codec)
            await old.remove()

    def close_spool(self, spool: Spool) -> None:
        """Close `spool` (it holds content) and hand it to the persister."""
        closed = spool.close()
        ROLLS.inc()
        self.closed_spools[(closed.fragment.begin, closed.fragment.end)] = closed.path
        stores = self.spec.fragment.stores
        persister, store_for = self.shared.persister, self.shared.store_for
        if persister is not None and store_for is not None and stores:
            # The primary uploads; peers upload their copy later, if still missing.
            persister.enqueue(closed, store_for(stores[0]),
                              None if self.is_primary else PEER_PERSIST_DELAY,
                              on_persisted=self.persisted)

    def persisted(self, fragment: Fragment) -> None:
        """The persister stored `fragment` (its local file is removed next)."""
        self.index.add(fragment)
        self.closed_spools.pop((fragment.begin, fragment.end), None)
