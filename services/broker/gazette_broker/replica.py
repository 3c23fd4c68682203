"""A journal's replica on this broker: where appends are sequenced and written.

Appends to one journal run one at a time (an `asyncio.Lock`), so two appends never
interleave; each is written into the spool as its chunks arrive and committed only when
the client ends it cleanly. A client that disconnects or stalls (no content for
`append_idle_timeout`), an expected offset that is not the write head, registers that do
not match, or an append over the size limit leave nothing behind (the spool rolls back).
Registers are labels an append can test and change atomically: the consumer's recovery
log fences out stale writers with them.

The spool rolls to a new fragment before an append once it reached the spec's length or
flush interval; closed spools go to the persister for the spec's first store. Appends
wait, then are refused (FRAGMENT_STORE_UNHEALTHY), while that store has more bytes
waiting to be persisted than the broker's budget.

In a cluster (`Peering`), the replica follows its journal's route: as primary it appends
through a replication `Pipeline` to its peers (an append commits only once every peer
has it), and announces each route its pipeline was synced under (so the allocator may
then shrink the route); as a peer it serves the primary's Replicate stream into its own
spool. A `Replica` is composed of parts sharing one `ReplicaState`
(`gazette_broker.replica_state`): `PrimaryPart` (`gazette_broker.primary`), `PeerPart`
(`gazette_broker.peer`) and `ReadPart` (`gazette_broker.reads`); the appends and the
background loop are here.

`close()` releases everything a replica holds (its spool, pipeline, peer sessions and
blocked readers) when its journal is deleted or moved to other brokers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator
from datetime import timedelta
from pathlib import Path

from prometheus_client import Counter

from gazette.client import AppendResult, ReadChunk
from gazette.cluster import Resolution
from gazette.fragment import (
    NO_SHA1,
    Fragment,
    JournalClosed,
    JournalIndex,
    Spool,
    ThreadedSha1,
)
from gazette.fragment.store import StoreError
from gazette.labels import LabelSet, Selector
from gazette.pb import broker_pb2 as pb
from gazette.protocol import JournalSpec, ReplicateContent, Status
from gazette_broker.errors import AppendError, AppendStalled
from gazette_broker.idle import IdleWatch
from gazette_broker.peer import PeerPart, Reply
from gazette_broker.pipeline import Pipeline, append_outcome
from gazette_broker.primary import PrimaryPart
from gazette_broker.reads import ReadPart
from gazette_broker.replica_state import (
    DEFAULT_APPEND_IDLE_TIMEOUT,
    DEFAULT_MAX_APPEND_SIZE,
    ReplicaState,
    Shared,
)

__all__ = ["APPENDS", "DEFAULT_APPEND_IDLE_TIMEOUT", "DEFAULT_MAX_APPEND_SIZE", "Replica",
           "Shared"]

log = logging.getLogger(__name__)

APPENDS = Counter("gazette_broker_appends_total", "Appends answered, by status", ["status"])
APPEND_BYTES = Counter("gazette_broker_append_bytes_total", "Bytes of committed appends")
SYNC_FAILURES = Counter("gazette_broker_sync_failures_total",
                        "Primaries' pipeline syncs or route announcements that failed "
                        "(each tried again)")

#: How long an append waits for its store to get under the broker's byte budget.
ROOM_WAIT_SECONDS = 10.0
#: How long an append at an offset ahead of the write head waits for the head to get
#: there (a writer pipelining appends at expected offsets: one may arrive before the
#: one it follows) before it is refused WRONG_APPEND_OFFSET.
AHEAD_WAIT_SECONDS = 10.0
#: A primary whose pipeline could not be synced tries again after this long at first.
SYNC_RETRY_SECONDS, SYNC_RETRY_MAX = 0.5, 5.0


class Replica:
    """A replica of one journal on this broker: its primary (appends) or a peer
    (replicated into). Without `shared.peering`, a lone primary (no cluster). Its
    `state` is shared by its parts: `as_primary` (route, pipeline, announcements),
    `as_peer` (Replicate streams) and `reads`."""

    def __init__(self, spec: JournalSpec, spool_dir: Path, shared: Shared | None = None,
                 spool: Spool | None = None) -> None:
        """`spool`: the open spool to start with (`open` makes it in a worker thread);
        else a new one at the index's end."""
        self.state = state = ReplicaState(spec, spool_dir, shared or Shared(), spool)
        self.as_primary = PrimaryPart(state)
        self.as_peer = PeerPart(state)
        self.reads = ReadPart(state)
        self.max_append_size = state.shared.max_append_size
        self._rate_start = time.monotonic()
        self._rate_bytes = 0

    @classmethod
    async def open(cls, spec: JournalSpec, spool_dir: Path,
                   shared: Shared | None = None) -> Replica:
        """A replica whose write head continues after the journal's persisted content:
        the stores are listed first (a fresh broker serves old content after one
        listing)."""
        await asyncio.to_thread(spool_dir.mkdir, parents=True, exist_ok=True)
        replica = cls(spec, spool_dir, shared, await Spool.create(
            spec.name, 0, spool_dir, spec.fragment.compression_codec))
        state = replica.state
        try:
            await state.refresh()
            head = state.index.end_offset
            if head > state.spool.end:
                await state.spool.remove()
                state.spool = await Spool.create(spec.name, head, spool_dir,
                                                 spec.fragment.compression_codec)
        except BaseException:
            await state.spool.remove()
            raise
        return replica

    # -- what other modules read and call: the state's, and its parts' ---------------

    @property
    def spec(self) -> JournalSpec:
        return self.state.spec

    @spec.setter
    def spec(self, spec: JournalSpec) -> None:
        self.state.spec = spec

    @property
    def shared(self) -> Shared:
        return self.state.shared

    @property
    def spool(self) -> Spool:
        return self.state.spool

    @property
    def index(self) -> JournalIndex:
        return self.state.index

    @property
    def registers(self) -> LabelSet:
        return self.state.registers

    @property
    def resolution(self) -> Resolution[JournalSpec] | None:
        return self.state.resolution

    @property
    def closed(self) -> str:
        """Why the replica was closed ("" while it serves)."""
        return self.state.closed

    @property
    def write_head(self) -> int:
        return self.state.write_head

    @property
    def is_primary(self) -> bool:
        return self.state.is_primary

    async def refresh(self, now: float | None = None) -> None:
        await self.state.refresh(now)

    def update_route(self, res: Resolution[JournalSpec]) -> None:
        self.as_primary.update_route(res)

    async def sync(self) -> bool:
        return await self.as_primary.sync()

    async def replicate(self, first: pb.ReplicateRequest,
                        requests: AsyncIterator[ReplicateContent], reply: Reply) -> None:
        await self.as_peer.replicate(first, requests, reply)

    def read(self, offset: int, *, block: bool = False, end_offset: int = 0,
             leave_gaps: bool = False) -> AsyncGenerator[ReadChunk, None]:
        return self.reads.read(offset, block=block, end_offset=end_offset,
                               leave_gaps=leave_gaps)

    async def locate(self, offset: int, *, block: bool = False) -> tuple[int, Fragment]:
        return await self.reads.locate(offset, block=block)

    def is_remote(self, fragment: Fragment) -> bool:
        return self.reads.is_remote(fragment)

    async def sign(self, fragment: Fragment, ttl: timedelta) -> str:
        return await self.reads.sign(fragment, ttl)

    def fragments(self) -> list[Fragment]:
        return self.reads.fragments()

    def persist_error(self, fragment: Fragment) -> str:
        """Why the last upload of a closed, unpersisted `fragment` failed ("" if none)."""
        persister = self.state.shared.persister
        if fragment.backing_store or persister is None:
            return ""
        return persister.error_of(fragment)

    # -- appends ---------------------------------------------------------------------

    async def append(self, chunks: AsyncIterable[bytes | memoryview], *, offset: int | None = None,
                     check_registers: Selector | None = None,
                     union_registers: LabelSet | None = None,
                     subtract_registers: LabelSet | None = None,
                     sum_content: bool = True) -> AppendResult:
        """Append the concatenated `chunks` atomically. Raises `AppendError` (nothing
        written) when refused, `AppendStalled` (nothing written) when `chunks` brings
        nothing for too long; if `chunks` raises (the client went away), the append is
        rolled back and the error propagates. Without `sum_content`, each byte is
        hashed once (into the fragment's SHA-1) and the commit carries `NO_SHA1`."""
        try:
            result = await self._append(chunks, offset, check_registers, union_registers,
                                        subtract_registers, sum_content)
        except AppendError as err:
            APPENDS.labels(err.status).inc()
            raise
        except BaseException:
            APPENDS.labels("ABORTED").inc()
            raise
        APPENDS.labels("OK").inc()
        APPEND_BYTES.inc(result.commit.size)
        return result

    async def _check_room(self) -> None:
        """Wait (bounded) while the journal's store has more bytes waiting to be
        persisted than the broker's budget; then refuse."""
        persister, stores = self.state.shared.persister, self.spec.fragment.stores
        if persister is None or not stores or persister.has_room(stores[0]):
            return
        if await persister.wait_for_room(stores[0], ROOM_WAIT_SECONDS):
            return
        health = persister.health(stores[0])
        raise AppendError(Status.FRAGMENT_STORE_UNHEALTHY, (
            f"{self.spec.name}: {health.pending_bytes} bytes of its fragments wait to be "
            f"persisted to {stores[0]} (the broker's budget is "
            f"{persister.max_pending_bytes}); "
            + (f"uploads fail: {health.last_error}" if health.failing
               else "uploads are slower than appends") + "; retry later"))

    async def _append(self, chunks: AsyncIterable[bytes | memoryview], offset: int | None,
                      check_registers: Selector | None, union_registers: LabelSet | None,
                      subtract_registers: LabelSet | None, sum_content: bool
                      ) -> AppendResult:
        state, name = self.state, self.spec.name
        if not self.spec.flags.may_write:
            raise AppendError(Status.NOT_ALLOWED, f"{name} is read-only (O_RDONLY)")
        await self._check_room()
        if offset is not None and offset > state.write_head:
            await self._wait_for_head(offset)
        async with state.lock:
            if state.closed:
                raise AppendError(Status.NOT_JOURNAL_PRIMARY_BROKER,
                                  f"{name} is no longer served here ({state.closed})")
            pipeline = await self.as_primary.ready_pipeline()
            peering = state.peering
            members = len(state.resolution.route.members) if state.resolution else 1
            if members < self.spec.replication and peering is not None:
                raise AppendError(Status.INSUFFICIENT_JOURNAL_BROKERS,
                                  f"{name} has {members} of its "
                                  f"{self.spec.replication} brokers")
            if offset is not None and offset != state.write_head:
                raise AppendError(Status.WRONG_APPEND_OFFSET,
                                  f"expected offset {offset}, write head is {state.write_head}")
            if check_registers is not None and not check_registers.matches(state.registers):
                raise AppendError(Status.REGISTER_MISMATCH, f"registers {state.registers!r} do not "
                                  f"match {check_registers}")
            await self._maybe_roll(pipeline)
            spool, begin, size = state.spool, state.write_head, 0
            # The append's own SHA-1 (unless not wanted) and the spool's, summed on the
            # hasher's thread.
            sha1 = ThreadedSha1(state.shared.hasher, also=[spool.pending_sum],
                                own=sum_content,
                                write=functools.partial(spool.write, summed=True),
                                writer=state.shared.writer)
            registers = state.registers
            if union_registers:
                registers = registers | union_registers
            if subtract_registers:
                registers = registers - subtract_registers
            with append_outcome(name, commits_content=True):
                try:
                    async with IdleWatch(state.shared.append_idle_timeout,
                                         AppendStalled) as idle:
                        async for chunk in chunks:
                            idle.touch()
                            if size + len(chunk) > self.max_append_size:
                                raise AppendError(Status.APPEND_TOO_LARGE, "append is larger than "
                                                  f"the {self.max_append_size}-byte limit")
                            await sha1.update(chunk)
                            if pipeline is not None:
                                await pipeline.send(chunk, size)
                            size += len(chunk)
                            await self._throttle(len(chunk))
                    digest = await sha1.digest()
                    if pipeline is not None:
                        assert peering is not None
                        if not peering.live() or not state.is_primary or state.closed:
                            raise AppendError(Status.NOT_JOURNAL_PRIMARY_BROKER,
                                              f"{peering.me} is no longer the primary, or "
                                              f"may have lost its lease")
                        await pipeline.propose(spool.pending, registers)
                except BaseException:
                    # The thread writes and sums nothing more into the spool; its pending
                    # sum is dropped, its file cut back.
                    try:
                        await sha1.settle()
                    finally:
                        spool.rollback()
                    if pipeline is not None:
                        pipeline.close()  # peers drop what is pending; the next append re-syncs
                    raise
            first = spool.end == spool.begin
            spool.commit()
            state.index.add(spool.fragment)
            state.registers = registers
            if first:
                state.reschedule.set()  # the flush interval runs from now
            return AppendResult(Fragment(name, begin, begin + size,
                                         digest if sum_content else NO_SHA1), registers)

    async def _wait_for_head(self, offset: int) -> None:
        """Until the write head reaches `offset` (the appends before it, pipelined by
        the same writer, landed), or `AHEAD_WAIT_SECONDS`: the offset is checked under
        the lock either way."""
        state = self.state
        deadline = time.monotonic() + AHEAD_WAIT_SECONDS
        while state.write_head < offset and not state.closed:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            head = state.write_head
            try:
                if state.index.end_offset > head:  # (not a signal of the head's moves)
                    await state.index.wait_changed(min(left, 0.05))
                else:
                    await state.index.wait_for(head, timeout=left)
            except (TimeoutError, JournalClosed):
                return

    async def _throttle(self, n: int) -> None:
        """Hold the append to the spec's max_append_rate (bytes per second)."""
        rate = self.spec.max_append_rate
        if not rate:
            return
        self._rate_bytes += n
        ahead = self._rate_bytes / rate - (time.monotonic() - self._rate_start)
        if ahead > 0:
            await asyncio.sleep(ahead)
        if ahead < -1.0:  # idle for a while: don't bank unlimited credit
            self._rate_start, self._rate_bytes = time.monotonic(), 0

    async def _maybe_roll(self, pipeline: Pipeline | None) -> None:
        state = self.state
        if state.roll_requested or state.spool.should_roll(self.spec.fragment):
            await state.roll()
            if pipeline is not None:  # the peers roll with us
                with append_outcome(self.spec.name, commits_content=False):
                    await pipeline.propose(state.spool.fragment, state.registers)

    async def roll(self) -> Fragment | None:
        """Close the spool (if it holds anything) and start a new one at the write head,
        between appends; the closed fragment goes to the persister and is returned. A
        primary's peers roll with it (if its pipeline is up; else they roll when it is
        synced next)."""
        async with self.state.lock:
            if self.state.closed:
                return None
            closed = await self.state.roll()
            if closed is not None:
                await self.as_primary.roll_peers()
            return closed

    # -- background work -------------------------------------------------------------

    async def run(self) -> None:
        """Until cancelled: roll the spool when its flush interval passes (even if no
        append comes), refresh from the stores every refresh interval, and, as a primary
        whose route changed, sync and announce it (again, with backoff, until done).
        Sleeps until the next of those is due: an idle journal costs nothing. A store
        that cannot be listed is logged and tried at the next refresh; an error of
        another kind ends it (its owner treats that as fatal)."""
        state = self.state
        refresh = self.spec.fragment.refresh_interval.total_seconds()
        # Spread the refreshes of many journals opened together.
        next_refresh = time.monotonic() + refresh * random.uniform(0.5, 1.0)
        retry_delay = SYNC_RETRY_SECONDS
        next_sync: float | None = None
        while True:
            now = time.monotonic()
            deadlines = [next_refresh]
            if next_sync is not None:
                deadlines.append(next_sync)
            roll_at = self._roll_deadline()
            if roll_at is not None:
                deadlines.append(roll_at)
            state.reschedule.clear()
            if not state.pulse.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, min(deadlines) - now)):
                        await _first(state.pulse, state.reschedule)
            now = time.monotonic()
            if state.pulse.is_set() or (next_sync is not None and now >= next_sync):
                state.pulse.clear()
                if await self.as_primary.sync():
                    next_sync, retry_delay = None, SYNC_RETRY_SECONDS
                else:
                    SYNC_FAILURES.inc()
                    next_sync = now + retry_delay
                    retry_delay = min(retry_delay * 2, SYNC_RETRY_MAX)
            roll_at = self._roll_deadline()
            if roll_at is not None and now >= roll_at:
                await self.roll()
            if now >= next_refresh:
                next_refresh = now + self.spec.fragment.refresh_interval.total_seconds()
                try:
                    await state.refresh()
                except StoreError as exc:
                    log.warning("refreshing %s failed: %s", self.spec.name, exc)

    def _roll_deadline(self) -> float | None:
        """When the open spool's flush interval ends (None: no interval, or empty)."""
        interval = self.spec.fragment.flush_interval.total_seconds()
        first = self.state.spool.first_append_at
        if not interval or first is None or not self.state.is_primary:
            return None
        return first + interval

    def update_spec(self, spec: JournalSpec) -> None:
        """A new revision of the spec. A changed codec or store takes effect with the
        next fragment: the spool rolls before the next append."""
        state = self.state
        if spec == state.spec:
            return
        if (spec.fragment.compression_codec != state.spec.fragment.compression_codec
                or spec.fragment.stores != state.spec.fragment.stores):
            state.roll_requested = True
        state.spec = spec
        state.reschedule.set()

    async def close(self, reason: str) -> None:
        """Stop serving (the journal was deleted, or moved to other brokers): the open
        spool goes to the persister (or is removed, if empty), the pipeline and peer
        sessions end, and blocked readers end with `JournalClosed`. Waits for an append
        in progress (bounded by the idle timeout). Idempotent."""
        state = self.state
        if state.closed:
            return
        state.closed = reason
        state.wake_sessions()  # a peer session holding the lock sees `closed` and ends
        state.index.close(reason)
        async with state.lock:
            self.as_primary.close()
            spool = state.spool
            if spool.end > spool.begin:
                state.close_spool(spool)
            else:
                await spool.remove()


async def _first(*events: asyncio.Event) -> None:
    """Return once any of `events` is set."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
