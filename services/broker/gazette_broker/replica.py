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
spool (`gazette_broker.peer`). Reads are in `gazette_broker.reads`.

`close()` releases everything a replica holds (its spool, pipeline, peer sessions and
blocked readers) when its journal is deleted or moved to other brokers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Counter

from gazette.allocator import Route
from gazette.client import AppendResult, AppendUncertain
from gazette.cluster import Resolution
from gazette.fragment import Fragment, FragmentCache, JournalIndex, Persister, Spool, ThreadedSha1
from gazette.fragment.store import FragmentStore, StoreError
from gazette.labels import LabelSet, Selector
from gazette.protocol import CompressionCodec, JournalSpec
from gazette_broker.errors import AppendError, AppendStalled
from gazette_broker.idle import IdleWatch
from gazette_broker.peer import PeerSide
from gazette_broker.pipeline import (
    Pipeline,
    ReplicationFailed,
    ReplicationUncertain,
)
from gazette_broker.primary import Peering, PrimarySide
from gazette_broker.reads import Gap, ReadSide

log = logging.getLogger(__name__)

APPENDS = Counter("gazette_broker_appends_total", "Appends answered, by status", ["status"])
APPEND_BYTES = Counter("gazette_broker_append_bytes_total", "Bytes of committed appends")
ROLLS = Counter("gazette_broker_fragments_rolled_total", "Spools closed into fragments")
SYNC_FAILURES = Counter("gazette_broker_sync_failures_total",
                        "Primaries' pipeline syncs or route announcements that failed "
                        "(each tried again)")

#: Largest append accepted unless the broker is configured otherwise.
DEFAULT_MAX_APPEND_SIZE = 256 << 20
#: An append stream that brings no content for this long is aborted (nothing written):
#: it holds the journal's lock, so a stalled client must not keep it for ever.
DEFAULT_APPEND_IDLE_TIMEOUT = 30.0
#: How long an append waits for its store to get under the broker's byte budget.
ROOM_WAIT_SECONDS = 10.0
#: A peer uploads its copy of a closed fragment this long after closing it, if the
#: primary has not uploaded it by then.
PEER_PERSIST_DELAY = 5.0
#: A primary whose pipeline could not be synced tries again after this long at first.
SYNC_RETRY_SECONDS, SYNC_RETRY_MAX = 0.5, 5.0


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
    peering: Peering | None = None
    max_append_size: int = DEFAULT_MAX_APPEND_SIZE
    append_idle_timeout: float = DEFAULT_APPEND_IDLE_TIMEOUT


class Replica(PrimarySide, ReadSide, PeerSide):
    """A replica of one journal on this broker: its primary (appends) or a peer
    (replicated into). Without `shared.peering`, a lone primary (no cluster)."""

    def __init__(self, spec: JournalSpec, spool_dir: Path, shared: Shared | None = None,
                 spool: Spool | None = None) -> None:
        """`spool`: the open spool to start with (`open` makes it in a worker thread);
        else a new one at the index's end."""
        self.spec = spec
        self.shared = shared = shared or Shared()
        self._peering = shared.peering
        self._persister, self._store_for = shared.persister, shared.store_for
        self.max_append_size = shared.max_append_size
        self.resolution: Resolution[JournalSpec] | None = None
        self._pipeline: Pipeline | None = None
        self._announced: Route | None = None
        #: Set (and replaced) whenever the route changes, a peer session starts or the
        #: replica closes: peer sessions then check whether they may go on.
        self._route_changed = asyncio.Event()
        self._sessions = 0  # peer sessions started: the latest one is served
        self._pulse = asyncio.Event()  # the primary should sync its pipeline now
        self._reschedule = asyncio.Event()  # `run` should work out its deadlines again
        self._gaps: list[Gap] = []
        self._skipped: list[tuple[int, int]] = []  # gaps reads gave up
        self._last_gap_refresh = 0.0
        self._hasher = shared.hasher
        self._dir = spool_dir
        spool_dir.mkdir(parents=True, exist_ok=True)
        self.index = JournalIndex(spec.name)
        self.registers = LabelSet()
        self._lock = asyncio.Lock()
        self._spool = spool or Spool(spec.name, 0, spool_dir,
                                     spec.fragment.compression_codec)
        self._rate_start = time.monotonic()
        self._rate_bytes = 0
        self._roll_requested = False
        #: Closed spools not yet known persisted: (begin, end) -> local file.
        self._closed: dict[tuple[int, int], Path] = {}
        self._cache = shared.cache or FragmentCache(spool_dir / "cache")
        #: Why the replica was closed ("" while it serves).
        self.closed = ""

    @classmethod
    async def open(cls, spec: JournalSpec, spool_dir: Path,
                   shared: Shared | None = None) -> Replica:
        """A replica whose write head continues after the journal's persisted content:
        the stores are listed first (a fresh broker serves old content after one
        listing)."""
        await asyncio.to_thread(spool_dir.mkdir, parents=True, exist_ok=True)
        replica = cls(spec, spool_dir, shared, await Spool.create(
            spec.name, 0, spool_dir, spec.fragment.compression_codec))
        try:
            await replica.refresh()
            head = replica.index.end_offset
            if head > replica._spool.end:
                await replica._spool.remove()
                replica._spool = await Spool.create(spec.name, head, spool_dir,
                                                    spec.fragment.compression_codec)
        except BaseException:
            await replica._spool.remove()
            raise
        return replica

    async def refresh(self, now: float | None = None) -> None:
        """Rebuild the persisted part of the index from a listing of every store. As
        the primary (or alone), also remove fragments older than the spec's retention
        from the stores."""
        if self._store_for is None:
            return
        listed: list[Fragment] = []
        for url in self.spec.fragment.stores:
            listed.extend(await self._store_for(url).list(self.spec.name))
        retention = self.spec.fragment.retention.total_seconds()
        cutoff, expired = None, []
        if retention:
            cutoff = (time.time() if now is None else now) - retention
            expired = [f for f in listed if f.mod_time and f.mod_time < cutoff]
            if self.is_primary:
                for f in expired:
                    await self._store_for(f.backing_store).remove(f)
            listed = [f for f in listed if f not in expired]
        self.index.replace_persisted(listed, cutoff, expired)

    @property
    def spool(self) -> Spool:
        return self._spool

    # -- appends ---------------------------------------------------------------------

    async def append(self, chunks: AsyncIterable[bytes | memoryview], *, offset: int | None = None,
                     check_registers: Selector | None = None,
                     union_registers: LabelSet | None = None,
                     subtract_registers: LabelSet | None = None) -> AppendResult:
        """Append the concatenated `chunks` atomically. Raises `AppendError` (nothing
        written) when refused, `AppendStalled` (nothing written) when `chunks` brings
        nothing for too long; if `chunks` raises (the client went away), the append is
        rolled back and the error propagates."""
        try:
            result = await self._append(chunks, offset, check_registers, union_registers,
                                        subtract_registers)
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
        persister, stores = self._persister, self.spec.fragment.stores
        if persister is None or not stores or persister.has_room(stores[0]):
            return
        if await persister.wait_for_room(stores[0], ROOM_WAIT_SECONDS):
            return
        health = persister.health(stores[0])
        raise AppendError("FRAGMENT_STORE_UNHEALTHY", (
            f"{self.spec.name}: {health.pending_bytes} bytes of its fragments wait to be "
            f"persisted to {stores[0]} (the broker's budget is "
            f"{persister.max_pending_bytes}); "
            + (f"uploads fail: {health.last_error}" if health.failing
               else "uploads are slower than appends") + "; retry later"))

    async def _append(self, chunks: AsyncIterable[bytes | memoryview], offset: int | None,
                      check_registers: Selector | None, union_registers: LabelSet | None,
                      subtract_registers: LabelSet | None) -> AppendResult:
        if not self.spec.flags.may_write:
            raise AppendError("NOT_ALLOWED", f"{self.spec.name} is read-only (O_RDONLY)")
        await self._check_room()
        async with self._lock:
            if self.closed:
                raise AppendError("NOT_JOURNAL_PRIMARY_BROKER",
                                  f"{self.spec.name} is no longer served here ({self.closed})")
            pipeline = await self._ready_pipeline()
            members = len(self.resolution.route.members) if self.resolution else 1
            if members < self.spec.replication and self._peering is not None:
                raise AppendError("INSUFFICIENT_JOURNAL_BROKERS",
                                  f"{self.spec.name} has {members} of its "
                                  f"{self.spec.replication} brokers")
            if offset is not None and offset != self.write_head:
                raise AppendError("WRONG_APPEND_OFFSET",
                                  f"expected offset {offset}, write head is {self.write_head}")
            if check_registers is not None and not check_registers.matches(self.registers):
                raise AppendError("REGISTER_MISMATCH", f"registers {self.registers!r} do not "
                                  f"match {check_registers}")
            await self._maybe_roll(pipeline)
            spool, begin, size = self._spool, self.write_head, 0
            # The append's own SHA-1 and the spool's, summed on the hasher's thread.
            sha1 = ThreadedSha1(self._hasher, also=[spool.pending_sum])
            registers = self.registers
            if union_registers:
                registers = registers | union_registers
            if subtract_registers:
                registers = registers - subtract_registers
            try:
                async with IdleWatch(self.shared.append_idle_timeout, AppendStalled) as idle:
                    async for chunk in chunks:
                        idle.touch()
                        if size + len(chunk) > self.max_append_size:
                            raise AppendError("APPEND_TOO_LARGE", "append is larger than "
                                              f"the {self.max_append_size}-byte limit")
                        spool.write(chunk, summed=True)
                        await sha1.update(chunk)
                        if pipeline is not None:
                            await pipeline.send(chunk, size)
                        size += len(chunk)
                        await self._throttle(len(chunk))
                digest = await sha1.digest()
                if pipeline is not None:
                    assert self._peering is not None
                    if not self._peering.live() or not self.is_primary or self.closed:
                        raise AppendError("NOT_JOURNAL_PRIMARY_BROKER",
                                          f"{self._peering.me} is no longer the primary, or "
                                          f"may have lost its lease")
                    await pipeline.propose(spool.pending, registers)
            except BaseException as err:
                # The spool's pending sum is dropped: chunks the thread may still be
                # summing into it change nothing.
                spool.rollback()
                if pipeline is not None:
                    pipeline.close()  # peers drop what is pending; the next append re-syncs
                if isinstance(err, ReplicationFailed):
                    raise AppendError(err.status, err.message) from None
                if isinstance(err, ReplicationUncertain):
                    raise AppendUncertain(self.spec.name, str(err)) from None
                raise
            first = spool.end == spool.begin
            spool.commit()
            self.index.add(spool.fragment)
            self.registers = registers
            if first:
                self._reschedule.set()  # the flush interval runs from now
            return AppendResult(
                Fragment(self.spec.name, begin, begin + size, digest), self.registers)

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
        if self._roll_requested or self._spool.should_roll(self.spec.fragment):
            await self._roll()
            if pipeline is not None:  # the peers roll with us
                try:
                    await pipeline.propose(self._spool.fragment, self.registers)
                except (ReplicationFailed, ReplicationUncertain) as err:
                    raise AppendError("REPLICATION_FAILED", str(err)) from None

    async def roll(self) -> Fragment | None:
        """Close the spool (if it holds anything) and start a new one at the write head,
        between appends; the closed fragment goes to the persister and is returned. A
        primary's peers roll with it (if its pipeline is up; else they roll when it is
        synced next)."""
        async with self._lock:
            if self.closed:
                return None
            closed = await self._roll()
            pipeline = self._pipeline
            if closed is not None and pipeline is not None and not pipeline.broken \
                    and self.is_primary:
                try:
                    await pipeline.propose(self._spool.fragment, self.registers)
                except (ReplicationFailed, ReplicationUncertain) as err:
                    log.info("rolling %s: %s", self.spec.name, err)
            return closed

    async def _roll_to(self, begin: int, codec: CompressionCodec | None = None) -> None:
        """Roll, and start the new spool at `begin` (>= the write head); offsets skipped
        are a gap that only peers hold until it is persisted."""
        await self._roll()
        codec = codec or self.spec.fragment.compression_codec
        if (self._spool.begin, self._spool.codec) != (begin, codec):
            if begin > self._spool.begin:
                log.info("%s: rolled to %d; [%d, %d) is held by peers only until they "
                         "persist it", self.spec.name, begin, self._spool.begin, begin)
                self._gaps.append(Gap(self._spool.begin, begin))
            old = self._spool
            self._spool = await Spool.create(self.spec.name, begin, self._dir, codec)
            await old.remove()

    async def _roll(self) -> Fragment | None:
        self._roll_requested = False
        old = self._spool
        if old.end == old.begin:
            if old.codec != self.spec.fragment.compression_codec:  # nothing to close, but
                # the next fragment takes the spec's codec of now
                self._spool = await Spool.create(self.spec.name, old.begin, self._dir,
                                                 self.spec.fragment.compression_codec)
                await old.remove()
            return None
        # The next spool's file is made first: until it is, `old` stays the open spool.
        new = await Spool.create(self.spec.name, old.end, self._dir,
                                 self.spec.fragment.compression_codec)
        self._close_spool(old)
        self._spool = new
        self._reschedule.set()
        return old.fragment

    def _close_spool(self, spool: Spool) -> None:
        """Close `spool` (it holds content) and hand it to the persister."""
        closed = spool.close()
        ROLLS.inc()
        self._closed[(closed.fragment.begin, closed.fragment.end)] = closed.path
        stores = self.spec.fragment.stores
        if self._persister is not None and self._store_for is not None and stores:
            # The primary uploads; peers upload their copy later, if still missing.
            self._persister.enqueue(closed, self._store_for(stores[0]),
                                    None if self.is_primary else PEER_PERSIST_DELAY,
                                    on_persisted=self.persisted)

    def persist_error(self, fragment: Fragment) -> str:
        """Why the last upload of a closed, unpersisted `fragment` failed ("" if none)."""
        if fragment.backing_store or self._persister is None:
            return ""
        return self._persister.error_of(fragment)

    def persisted(self, fragment: Fragment) -> None:
        """The persister stored `fragment` (its local file is removed next)."""
        self.index.add(fragment)
        self._closed.pop((fragment.begin, fragment.end), None)

    # -- background work -------------------------------------------------------------

    async def run(self) -> None:
        """Until cancelled: roll the spool when its flush interval passes (even if no
        append comes), refresh from the stores every refresh interval, and, as a primary
        whose route changed, sync and announce it (again, with backoff, until done).
        Sleeps until the next of those is due: an idle journal costs nothing. A store
        that cannot be listed is logged and tried at the next refresh; an error of
        another kind ends it (its owner treats that as fatal)."""
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
            self._reschedule.clear()
            if not self._pulse.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, min(deadlines) - now)):
                        await _first(self._pulse, self._reschedule)
            now = time.monotonic()
            if self._pulse.is_set() or (next_sync is not None and now >= next_sync):
                self._pulse.clear()
                if await self.sync():
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
                    await self.refresh()
                except StoreError as exc:
                    log.warning("refreshing %s failed: %s", self.spec.name, exc)

    def _roll_deadline(self) -> float | None:
        """When the open spool's flush interval ends (None: no interval, or empty)."""
        interval = self.spec.fragment.flush_interval.total_seconds()
        first = self._spool.first_append_at
        if not interval or first is None or not self.is_primary:
            return None
        return first + interval

    def update_spec(self, spec: JournalSpec) -> None:
        """A new revision of the spec. A changed codec or store takes effect with the
        next fragment: the spool rolls before the next append."""
        if spec == self.spec:
            return
        if (spec.fragment.compression_codec != self.spec.fragment.compression_codec
                or spec.fragment.stores != self.spec.fragment.stores):
            self._roll_requested = True
        self.spec = spec
        self._reschedule.set()

    async def close(self, reason: str) -> None:
        """Stop serving (the journal was deleted, or moved to other brokers): the open
        spool goes to the persister (or is removed, if empty), the pipeline and peer
        sessions end, and blocked readers end with `JournalClosed`. Waits for an append
        in progress (bounded by the idle timeout). Idempotent."""
        if self.closed:
            return
        self.closed = reason
        self._wake_sessions()  # a peer session holding the lock sees `closed` and ends
        self.index.close(reason)
        async with self._lock:
            if self._pipeline is not None:
                self._pipeline.close()
                self._pipeline = None
            spool = self._spool
            if spool.end > spool.begin:
                self._close_spool(spool)
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
