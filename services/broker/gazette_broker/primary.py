"""A replica's primary part: following the journal's route, keeping a replication
pipeline synced under it, and announcing each route it synced.

A primary opens a `Pipeline` to its peers under the route it resolved; peers holding
other fragments (a new peer, a failed primary's last proposals) make every replica roll
to a new, empty fragment past the furthest of them. Once synced, the route is written
into the journal's assignments (`Peering.announce`), which is what the allocator's
consistency check reads before it shrinks the route; an assignment that moved to another
slot under the same route is announced again.
"""

from __future__ import annotations

import logging

from prometheus_client import Counter

from gazette.allocator import Route
from gazette.cluster import Resolution
from gazette.keyspace import EtcdError
from gazette.pb import broker_pb2 as pb
from gazette.protocol import JournalSpec, Status, labels_from_pb
from gazette_broker.errors import AppendError
from gazette_broker.pipeline import (
    Pipeline,
    ReplicationFailed,
    ReplicationUncertain,
    append_outcome,
)
from gazette_broker.replica_state import ReplicaState

log = logging.getLogger(__name__)

SYNC_ROLLS = Counter("gazette_broker_sync_rolls_total",
                     "Pipeline syncs that rolled every replica past peers' fragments")


class PrimaryPart:
    """A replica's primary part: its pipeline under the route, and the last route it
    announced."""

    def __init__(self, state: ReplicaState) -> None:
        self.state = state
        self.pipeline: Pipeline | None = None
        self.announced: Route | None = None
        #: Counts the resolutions that found an assignment without the route: an
        #: announcement in flight when one comes may have missed that assignment.
        self.unannounced_seen = 0

    def update_route(self, res: Resolution[JournalSpec]) -> None:
        """The journal's route (and its members' endpoints) as of a newer revision. A
        changed route ends peer sessions of the old one; its primary syncs a pipeline
        under the new one (and announces it) without waiting for an append."""
        state = self.state
        old, state.resolution = state.resolution, res
        if old is not None and (old.route, old.endpoints) == (res.route, res.endpoints):
            if not res.announced and state.is_primary:
                # Same route, but an assignment moved to another slot (a new key
                # without the route): announce it again, or the allocator waits for ever;
                # an announcement in flight may have been written before that key was.
                self.announced = None
                self.unannounced_seen += 1
                state.pulse.set()
            return
        state.wake_sessions()
        if state.is_primary:
            state.pulse.set()
            persister = state.shared.persister
            if persister is not None and not (old is not None and old.route.primary_id
                                              == res.route.primary_id):
                # Its spools closed as a peer wait PEER_PERSIST_DELAY before upload; as
                # primary it may hold content no live peer does (an append in doubt that
                # only it committed): persist now, or a crash soon after loses it.
                persister.flush(state.spec.name)

    async def ready_pipeline(self) -> Pipeline | None:
        """The pipeline under the current route, synced (opened anew if the route
        changed or it broke). Raises `AppendError` when appends cannot be taken here
        now: not the primary, too few brokers, or a peer that cannot be synced. The
        caller holds the lock."""
        state = self.state
        peering, res, name = state.peering, state.resolution, state.spec.name
        if peering is None:
            return None
        if res is None or res.route.primary_id != peering.me:
            raise AppendError(Status.NOT_JOURNAL_PRIMARY_BROKER,
                              f"{peering.me} is not the primary of {name}")
        if not peering.live():
            raise AppendError(Status.NOT_JOURNAL_PRIMARY_BROKER,
                              f"{peering.me} may have lost its lease: it takes no appends")
        pipeline = self.pipeline
        if pipeline is not None and not pipeline.broken and pipeline.route == res.route:
            return pipeline
        if pipeline is not None:
            pipeline.close()
        self.pipeline = None
        peers = [(m, res.endpoints[i]) for i, m in enumerate(res.route.members)
                 if m != peering.me]
        with append_outcome(name, commits_content=False):
            pipeline, replies = await Pipeline.open(
                name, res.route, peering.header(res), peers, peering.channels,
                state.spool.fragment, state.registers)
            mismatched = [r for r in replies if r.status != pb.OK]
            if mismatched:
                # Peers hold other fragments (a new peer, a failed primary's last
                # proposals): everyone rolls to a new, empty fragment past the furthest
                # of them. Content beyond our own was never acknowledged; it stays
                # wherever it is, and is persisted from there.
                SYNC_ROLLS.inc()
                top = max(mismatched, key=lambda r: r.fragment.end)
                head = state.write_head
                log.info("syncing %s: peers hold %s, this primary [%d, %d): all roll to %d",
                         name, ", ".join(f"[{r.fragment.begin}, {r.fragment.end})"
                                         for r in mismatched),
                         state.spool.begin, head, max(top.fragment.end, head))
                if top.fragment.end > head:
                    state.registers = labels_from_pb(top.registers, "registers")
                await state.roll_to(max(top.fragment.end, head))
                await pipeline.propose(state.spool.fragment, state.registers)
        self.pipeline = pipeline
        if self.announced != res.route:
            state.pulse.set()
        return pipeline

    async def roll_peers(self) -> None:
        """After a roll between appends: have the peers roll with this primary if its
        pipeline is up (else they roll when it is synced next). The caller holds the
        lock."""
        pipeline, state = self.pipeline, self.state
        if pipeline is None or pipeline.broken or not state.is_primary:
            return
        try:
            await pipeline.propose(state.spool.fragment, state.registers)
        except (ReplicationFailed, ReplicationUncertain) as err:
            log.info("rolling %s: %s", state.spec.name, err)

    def close(self) -> None:
        """End the pipeline (the replica closes; the caller holds the lock)."""
        if self.pipeline is not None:
            self.pipeline.close()
            self.pipeline = None

    async def sync(self) -> bool:
        """As primary: sync the pipeline under the current route, then announce the
        route (so the allocator knows every replica has it). Returns whether done."""
        state = self.state
        peering = state.peering
        if peering is None or not state.is_primary or state.closed:
            return True
        async with state.lock:
            try:
                await self.ready_pipeline()
            except AppendError as err:
                log.info("syncing %s: %s", state.spec.name, err)
                return False
        res = state.resolution
        assert res is not None
        if self.announced == res.route:
            return True
        seen = self.unannounced_seen
        try:
            announced = await peering.announce(state.spec.name, res.route)
        except EtcdError as err:
            log.warning("announcing the route of %s: %s", state.spec.name, err)
            return False
        if announced and seen == self.unannounced_seen:
            self.announced = res.route
        return announced  # (else the pulse set meanwhile announces it once more)
