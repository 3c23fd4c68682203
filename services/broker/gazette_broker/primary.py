"""The primary's side of a replica: following the journal's route, keeping a replication
pipeline synced under it, and announcing each route it synced.

A primary opens a `Pipeline` to its peers under the route it resolved; peers holding
other fragments (a new peer, a failed primary's last proposals) make every replica roll
to a new, empty fragment past the furthest of them. Once synced, the route is written
into the journal's assignments (`Peering.announce`), which is what the allocator's
consistency check reads before it shrinks the route; an assignment that moved to another
slot under the same route is announced again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import Counter

from gazette.allocator import Route
from gazette.cluster import Channels, Resolution
from gazette.fragment import Persister, Spool
from gazette.keyspace import EtcdError
from gazette.labels import LabelSet
from gazette.pb import broker_pb2 as pb
from gazette.protocol import CompressionCodec, JournalSpec, ProcessId, labels_from_pb
from gazette_broker.errors import AppendError
from gazette_broker.pipeline import (
    Pipeline,
    ReplicationFailed,
    ReplicationUncertain,
)

log = logging.getLogger(__name__)

SYNC_ROLLS = Counter("gazette_broker_sync_rolls_total",
                     "Pipeline syncs that rolled every replica past peers' fragments")


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


class PrimarySide:
    """The primary half of `Replica` (whose constructor sets these)."""

    spec: JournalSpec
    registers: LabelSet
    resolution: Resolution[JournalSpec] | None
    closed: str
    _spool: Spool
    _lock: asyncio.Lock
    _peering: Peering | None
    _pipeline: Pipeline | None
    _announced: Route | None
    _pulse: asyncio.Event
    _persister: Persister | None

    if TYPE_CHECKING:  # the other halves'
        @property
        def write_head(self) -> int: ...

        def _wake_sessions(self) -> None: ...

        async def _roll_to(self, begin: int, codec: CompressionCodec | None = None
                           ) -> None: ...

    @property
    def is_primary(self) -> bool:
        """Whether appends are taken here (a lone replica always takes them)."""
        if self._peering is None:
            return True
        return self.resolution is not None and \
            self.resolution.route.primary_id == self._peering.me

    def update_route(self, res: Resolution[JournalSpec]) -> None:
        """The journal's route (and its members' endpoints) as of a newer revision. A
        changed route ends peer sessions of the old one; its primary syncs a pipeline
        under the new one (and announces it) without waiting for an append."""
        old, self.resolution = self.resolution, res
        if old is not None and (old.route, old.endpoints) == (res.route, res.endpoints):
            if not res.announced and self._announced == res.route and self.is_primary:
                # Same route, but an assignment moved to another slot (a new key
                # without the route): announce it again, or the allocator waits for ever.
                self._announced = None
                self._pulse.set()
            return
        self._wake_sessions()
        if self.is_primary:
            self._pulse.set()
            if self._persister is not None and not (old is not None and old.route.primary_id
                                                    == res.route.primary_id):
                # Its spools closed as a peer wait PEER_PERSIST_DELAY before upload; as
                # primary it may hold content no live peer does (an append in doubt that
                # only it committed): persist now, or a crash soon after loses it.
                self._persister.flush(self.spec.name)

    async def _ready_pipeline(self) -> Pipeline | None:
        """The pipeline under the current route, synced (opened anew if the route
        changed or it broke). Raises `AppendError` when appends cannot be taken here
        now: not the primary, too few brokers, or a peer that cannot be synced."""
        peering, res = self._peering, self.resolution
        if peering is None:
            return None
        if res is None or res.route.primary_id != peering.me:
            raise AppendError("NOT_JOURNAL_PRIMARY_BROKER",
                              f"{peering.me} is not the primary of {self.spec.name}")
        if not peering.live():
            raise AppendError("NOT_JOURNAL_PRIMARY_BROKER",
                              f"{peering.me} may have lost its lease: it takes no appends")
        pipeline = self._pipeline
        if pipeline is not None and not pipeline.broken and pipeline.route == res.route:
            return pipeline
        if pipeline is not None:
            pipeline.close()
        self._pipeline = None
        peers = [(m, res.endpoints[i]) for i, m in enumerate(res.route.members)
                 if m != peering.me]
        try:
            pipeline, replies = await Pipeline.open(
                self.spec.name, res.route, peering.header(res), peers, peering.channels,
                self._spool.fragment, self.registers)
            mismatched = [r for r in replies if r.status != pb.OK]
            if mismatched:
                # Peers hold other fragments (a new peer, a failed primary's last
                # proposals): everyone rolls to a new, empty fragment past the furthest
                # of them. Content beyond our own was never acknowledged; it stays
                # wherever it is, and is persisted from there.
                SYNC_ROLLS.inc()
                top = max(mismatched, key=lambda r: r.fragment.end)
                log.info("syncing %s: peers hold %s, this primary [%d, %d): all roll to %d",
                         self.spec.name, ", ".join(f"[{r.fragment.begin}, {r.fragment.end})"
                                                   for r in mismatched),
                         self._spool.begin, self.write_head,
                         max(top.fragment.end, self.write_head))
                if top.fragment.end > self.write_head:
                    self.registers = labels_from_pb(top.registers, "registers")
                await self._roll_to(max(top.fragment.end, self.write_head))
                await pipeline.propose(self._spool.fragment, self.registers)
        except ReplicationFailed as err:
            raise AppendError(err.status, err.message) from None
        except ReplicationUncertain as err:  # a roll commits no content
            raise AppendError("REPLICATION_FAILED", str(err)) from None
        self._pipeline = pipeline
        if self._announced != res.route:
            self._pulse.set()
        return pipeline

    async def sync(self) -> bool:
        """As primary: sync the pipeline under the current route, then announce the
        route (so the allocator knows every replica has it). Returns whether done."""
        if self._peering is None or not self.is_primary or self.closed:
            return True
        async with self._lock:
            try:
                await self._ready_pipeline()
            except AppendError as err:
                log.info("syncing %s: %s", self.spec.name, err)
                return False
        res = self.resolution
        assert res is not None
        if self._announced == res.route:
            return True
        try:
            announced = await self._peering.announce(self.spec.name, res.route)
        except EtcdError as err:
            log.warning("announcing the route of %s: %s", self.spec.name, err)
            return False
        if announced:
            self._announced = res.route
        return announced
