"""A journal's replica on this broker: where appends are sequenced and written.

Appends to one journal run one at a time (an `asyncio.Lock`), so two appends never
interleave; each is written into the spool as its chunks arrive and committed only when
the client ends it cleanly. A client that disconnects, an expected offset that is not the
write head, registers that do not match, or an append over the size limit leave nothing
behind (the spool rolls back). Registers are labels an append can test and change
atomically: the consumer's recovery log fences out stale writers with them.

The spool rolls to a new fragment before an append once it reached the spec's length or
flush interval; closed spools go to the persister for the spec's first store.

In a cluster (`Peering`), the replica follows its journal's route: as primary it appends
through a replication `Pipeline` to its peers (an append commits only once every peer
has it), and announces each route its pipeline was synced under (so the allocator may
then shrink the route); as a peer it serves the primary's Replicate stream into its own
spool (`replicate`). When a pipeline sync rolls a replica past content only its peers
hold (not yet persisted), reads of that gap wait for the peers to persist it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from prometheus_client import Counter

from gazette.allocator import Route
from gazette.client.errors import AppendUncertain
from gazette.client.results import AppendResult, ReadChunk
from gazette.fragment import Fragment, FragmentIndex, Persister, Spool
from gazette.fragment.cache import FragmentCache
from gazette.fragment.fragment import fragment_from_pb, fragment_to_pb
from gazette.fragment.store import FragmentStore, StoreError
from gazette.fragment.summer import ThreadedSha1
from gazette.labels import LabelSet, Selector
from gazette.pb import broker_pb2 as pb
from gazette.protocol import (
    CompressionCodec,
    JournalSpec,
    ProcessId,
    labels_from_pb,
    labels_to_pb,
)
from gazette.protocol.content import ReplicateContent
from gazette_broker.errors import StatusError
from gazette_broker.pipeline import (
    Channels,
    Pipeline,
    ReplicationFailed,
    ReplicationUncertain,
)
from gazette_broker.resolver import Resolution

log = logging.getLogger(__name__)

APPENDS = Counter("gazette_broker_appends_total", "Appends answered, by status", ["status"])
APPEND_BYTES = Counter("gazette_broker_append_bytes_total", "Bytes of committed appends")
READ_BYTES = Counter("gazette_broker_read_bytes_total", "Bytes served to readers")
ROLLS = Counter("gazette_broker_fragments_rolled_total", "Spools closed into fragments")
REPLICATED_BYTES = Counter("gazette_broker_replicated_bytes_total",
                           "Bytes committed into this broker's spools as a peer")
SYNC_ROLLS = Counter("gazette_broker_sync_rolls_total",
                     "Pipeline syncs that rolled every replica past peers' fragments")

#: Largest append accepted unless the broker is configured otherwise.
DEFAULT_MAX_APPEND_SIZE = 256 << 20
#: A read waiting in a gap of content only peers held gives up waiting after this long
#: (that content was never acknowledged, and its holder may be gone) and skips it.
GAP_WAIT_SECONDS = 30.0
#: While reads wait in a gap, the stores are listed again at most this often.
GAP_REFRESH_SECONDS = 1.0
#: A peer uploads its copy of a closed fragment this long after closing it, if the
#: primary has not uploaded it by then.
PEER_PERSIST_DELAY = 5.0
#: A primary whose pipeline could not be synced tries again after this long.
SYNC_RETRY_SECONDS = 0.5


class AppendError(StatusError):
    """An append was refused; nothing was written."""


class ReadError(StatusError):
    """A read that cannot be served (yet)."""


#: Largest chunk a read yields at once (large messages are cheaper per byte over gRPC).
READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class Peering:
    """What a replica in a cluster needs: who this broker is, channels to its peers, the
    response header of a resolution, and how to announce a synced route (write it into
    the journal's assignments)."""

    me: ProcessId
    channels: Channels
    header: Callable[[Resolution], pb.Header]
    announce: Callable[[str, Route], Awaitable[bool]]
    #: Whether this broker's member lease is surely held: a primary whose lease may
    #: have expired takes no appends (another may be primary by now).
    live: Callable[[], bool] = lambda: True


@dataclass
class _Gap:
    """Offsets [begin, end) this replica rolled past, held by peers until persisted."""

    begin: int
    end: int
    since: float = field(default_factory=time.monotonic)


class Replica:
    """A replica of one journal on this broker: its primary (appends) or a peer
    (replicated into). Without `peering`, a lone primary (no cluster)."""

    def __init__(self, spec: JournalSpec, spool_dir: Path, index: FragmentIndex,
                 persister: Persister | None = None,
                 store_for: Callable[[str], FragmentStore] | None = None,
                 max_append_size: int = DEFAULT_MAX_APPEND_SIZE,
                 hasher: Executor | None = None, peering: Peering | None = None) -> None:
        """`hasher` (one thread) sums appends' SHA-1s (their own and the spool's)
        beside the loop; without it, the loop sums them."""
        self.spec = spec
        self._peering = peering
        self.resolution: Resolution | None = None
        self._pipeline: Pipeline | None = None
        self._announced: Route | None = None
        #: Set (and replaced) whenever the route changes or a peer session starts: peer
        #: sessions then check whether they may go on.
        self._route_changed = asyncio.Event()
        self._sessions = 0  # peer sessions started: the latest one is served
        self._pulse = asyncio.Event()  # the primary should sync its pipeline now
        self._gaps: list[_Gap] = []
        self._last_gap_refresh = 0.0
        self._hasher = hasher
        self._dir = spool_dir
        spool_dir.mkdir(parents=True, exist_ok=True)
        self._index = index
        self._persister = persister
        self._store_for = store_for
        self.max_append_size = max_append_size
        self.registers = LabelSet()
        self._lock = asyncio.Lock()
        head = index.end_offset(spec.name)
        self._spool = Spool(spec.name, head, spool_dir, spec.fragment.compression_codec)
        self._rate_start = time.monotonic()
        self._rate_bytes = 0
        self._roll_requested = False
        #: Closed spools not yet known persisted: (begin, end) -> local file.
        self._closed: dict[tuple[int, int], Path] = {}
        self._cache = FragmentCache(spool_dir / "cache")

    @classmethod
    async def open(cls, spec: JournalSpec, spool_dir: Path, index: FragmentIndex,
                   persister: Persister | None = None,
                   store_for: Callable[[str], FragmentStore] | None = None,
                   max_append_size: int = DEFAULT_MAX_APPEND_SIZE,
                   hasher: Executor | None = None, peering: Peering | None = None) -> Replica:
        """A replica whose write head continues after the journal's persisted content:
        the stores are listed first (a fresh broker serves old content after one
        listing)."""
        replica = cls(spec, spool_dir, index, persister, store_for, max_append_size, hasher,
                      peering)
        await replica.refresh()
        head = index.end_offset(spec.name)
        if head > replica._spool.end:
            replica._spool.discard()
            replica._spool = Spool(spec.name, head, spool_dir, spec.fragment.compression_codec)
        return replica

    async def refresh(self, now: float | None = None) -> None:
        """Rebuild the persisted part of the index from a listing of every store, and
        remove fragments older than the spec's retention from the stores."""
        if self._store_for is None:
            return
        listed: list[Fragment] = []
        for url in self.spec.fragment.stores:
            listed.extend(await self._store_for(url).list(self.spec.name))
        retention = self.spec.fragment.retention.total_seconds()
        if retention:
            cutoff = (time.time() if now is None else now) - retention
            expired = [f for f in listed if f.mod_time and f.mod_time < cutoff]
            for f in expired:
                await self._store_for(f.backing_store).remove(f)
            listed = [f for f in listed if f not in expired]
        self._index.replace_persisted(self.spec.name, listed)

    @property
    def write_head(self) -> int:
        return self._spool.end

    @property
    def spool(self) -> Spool:
        return self._spool

    async def append(self, chunks: AsyncIterable[bytes | memoryview], *, offset: int | None = None,
                     check_registers: Selector | None = None,
                     union_registers: LabelSet | None = None,
                     subtract_registers: LabelSet | None = None) -> AppendResult:
        """Append the concatenated `chunks` atomically. Raises `AppendError` (nothing
        written) when refused; if `chunks` raises (the client went away), the append is
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

    async def _append(self, chunks: AsyncIterable[bytes | memoryview], offset: int | None,
                      check_registers: Selector | None, union_registers: LabelSet | None,
                      subtract_registers: LabelSet | None) -> AppendResult:
        if not self.spec.flags.may_write:
            raise AppendError("NOT_ALLOWED", f"{self.spec.name} is read-only (O_RDONLY)")
        async with self._lock:
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
                async for chunk in chunks:
                    if size + len(chunk) > self.max_append_size:
                        raise AppendError("NOT_ALLOWED", f"append is larger than the "
                                          f"{self.max_append_size}-byte limit")
                    spool.write(chunk, summed=True)
                    await sha1.update(chunk)
                    if pipeline is not None:
                        await pipeline.send(chunk, size)
                    size += len(chunk)
                    await self._throttle(len(chunk))
                digest = await sha1.digest()
                if pipeline is not None:
                    assert self._peering is not None
                    if not self._peering.live() or not self.is_primary:
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
            spool.commit()
            self._index.add_local(spool.fragment)
            self.registers = registers
            return AppendResult(
                Fragment(self.spec.name, begin, begin + size, digest), self.registers)

    # -- the primary's side of replication --

    @property
    def is_primary(self) -> bool:
        """Whether appends are taken here (a lone replica always takes them)."""
        if self._peering is None:
            return True
        return self.resolution is not None and \
            self.resolution.route.primary_id == self._peering.me

    def update_route(self, res: Resolution) -> None:
        """The journal's route (and its members' endpoints) as of a newer revision. A
        changed route ends peer sessions of the old one; its primary syncs a pipeline
        under the new one (and announces it) without waiting for an append."""
        old, self.resolution = self.resolution, res
        if old is not None and (old.route, old.endpoints) == (res.route, res.endpoints):
            return
        self._wake_sessions()
        if self.is_primary:
            self._pulse.set()

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
                if top.fragment.end > self.write_head:
                    self.registers = labels_from_pb(top.registers, "registers")
                self._roll_to(max(top.fragment.end, self.write_head))
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
        if self._peering is None or not self.is_primary:
            return True
        async with self._lock:
            try:
                await self._ready_pipeline()
            except AppendError as err:
                log.info("syncing %s: %s", self.spec.name, err)
                return False
        return await self._announce()

    async def _announce(self) -> bool:
        res = self.resolution
        assert self._peering is not None and res is not None
        if self._announced == res.route:
            return True
        if await self._peering.announce(self.spec.name, res.route):
            self._announced = res.route
            return True
        return False

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
            self._roll()
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
            closed = self._roll()
            pipeline = self._pipeline
            if closed is not None and pipeline is not None and not pipeline.broken \
                    and self.is_primary:
                try:
                    await pipeline.propose(self._spool.fragment, self.registers)
                except (ReplicationFailed, ReplicationUncertain) as err:
                    log.info("rolling %s: %s", self.spec.name, err)
            return closed

    def _roll_to(self, begin: int, codec: CompressionCodec | None = None) -> None:
        """Roll, and start the new spool at `begin` (>= the write head); offsets skipped
        are a gap that only peers hold until it is persisted."""
        self._roll()
        codec = codec or self.spec.fragment.compression_codec
        if (self._spool.begin, self._spool.codec) != (begin, codec):
            if begin > self._spool.begin:
                self._gaps.append(_Gap(self._spool.begin, begin))
            self._spool.discard()
            self._spool = Spool(self.spec.name, begin, self._dir, codec)

    def _roll(self) -> Fragment | None:
        self._roll_requested = False
        old = self._spool
        if old.end == old.begin:
            if old.codec != self.spec.fragment.compression_codec:  # nothing to close, but
                old.discard()  # the next fragment takes the spec's codec of now
                self._spool = Spool(self.spec.name, old.begin, self._dir,
                                    self.spec.fragment.compression_codec)
            return None
        closed = old.close()
        ROLLS.inc()
        self._closed[(closed.fragment.begin, closed.fragment.end)] = closed.path
        self._spool = Spool(self.spec.name, closed.fragment.end, self._dir,
                            self.spec.fragment.compression_codec)
        stores = self.spec.fragment.stores
        if self._persister is not None and self._store_for is not None and stores:
            # The primary uploads; peers upload their copy later, if still missing.
            self._persister.enqueue(closed, self._store_for(stores[0]),
                                    None if self.is_primary else PEER_PERSIST_DELAY)
        return closed.fragment

    def _locate(self, offset: int) -> tuple[int, Fragment | None, bool]:
        """Where `offset` is read from now: (offset, fragment, whether it is the open
        spool's). The offset moves forward past a hole (content removed by retention);
        the fragment is None at or beyond the write head."""
        if offset == -1:
            offset = self.write_head
        if offset < 0:
            raise ReadError("INVALID_OFFSET", f"offset must be -1 or >= 0, got {offset}")
        spool = self._spool
        if offset >= spool.end:
            return offset, None, False
        if offset >= spool.begin:
            return offset, spool.fragment, True
        found = self._index.find(self.spec.name, offset)
        if (found is None or found.begin > offset) and self._in_gap(offset):
            return offset, None, False  # peers hold it: wait until it is persisted
        if found is None or found.begin >= spool.begin:
            # A hole reaching up to the open spool: the read goes on from there (and
            # waits there, if the spool is still empty).
            offset = spool.begin
            return (offset, spool.fragment, True) if spool.end > offset else \
                (offset, None, False)
        return max(offset, found.begin), found, False

    def _in_gap(self, offset: int) -> bool:
        """Whether `offset` is in a gap this replica rolled past that is neither persisted
        yet nor given up on."""
        for gap in list(self._gaps):
            if self._index.covers(self.spec.name, gap.begin, gap.end) or \
                    time.monotonic() - gap.since > GAP_WAIT_SECONDS:
                self._gaps.remove(gap)
            elif gap.begin <= offset < gap.end:
                return True
        return False

    async def _wait_at(self, offset: int) -> None:
        """Wait until `offset` may have become readable: an append reaching it, or, in a
        gap, the stores listed again (at most every few seconds) and the index changed."""
        if not self._in_gap(offset):
            await self._index.wait_for(self.spec.name, offset)
            return
        if not await self._refresh_for_gap():
            await self._index.wait_changed(self.spec.name, GAP_REFRESH_SECONDS)

    async def _refresh_for_gap(self) -> bool:
        """List the stores again for a read in a gap, unless that was just done;
        returns whether it was done now."""
        now = time.monotonic()
        if now - self._last_gap_refresh < GAP_REFRESH_SECONDS:
            return False
        self._last_gap_refresh = now
        try:
            await self.refresh()
        except StoreError as err:
            log.warning("listing %s for a read in a gap: %s", self.spec.name, err)
        return True

    async def locate(self, offset: int, *, block: bool = False) -> tuple[int, Fragment]:
        """The offset a read at `offset` starts from and the fragment holding it (for
        metadata-only reads). Without `block`, `ReadError` OFFSET_NOT_YET_AVAILABLE at
        the write head; with it, waits for the next append."""
        while True:
            offset, frag, _ = self._locate(offset)
            if frag is not None:
                return offset, frag
            if self._in_gap(offset) and await self._refresh_for_gap():
                continue
            if not block:
                raise ReadError("OFFSET_NOT_YET_AVAILABLE", f"offset {offset} is at or "
                                f"beyond the write head {self.write_head}")
            await self._wait_at(offset)

    def persisted(self, fragment: Fragment) -> None:
        """The persister stored `fragment` (and removed its local file)."""
        self._closed.pop((fragment.begin, fragment.end), None)

    def is_remote(self, fragment: Fragment) -> bool:
        """Whether `fragment` is only in a store (not in a local spool)."""
        return bool(fragment.backing_store) and \
            (fragment.begin, fragment.end) not in self._closed

    async def sign(self, fragment: Fragment, ttl: timedelta) -> str:
        """A URL to GET `fragment`'s file from its store for `ttl` ("" if unpersisted)."""
        if not fragment.backing_store or self._store_for is None:
            return ""
        return await self._store_for(fragment.backing_store).sign(fragment, ttl)

    def fragments(self) -> list[Fragment]:
        """The journal's fragments this broker knows, in offset order (the open spool's
        last)."""
        return list(self._index.fragments(self.spec.name))

    async def read(self, offset: int, *, block: bool = False,
                   end_offset: int = 0) -> AsyncGenerator[ReadChunk, None]:
        """Content from `offset` (-1: the write head) up to `end_offset` (0: no end),
        from the open spool, closed spools not yet persisted, or persisted fragments
        (fetched into a verified local cache: a corrupt one raises `CorruptFragment`).
        Without `block`, the read ends at the write head, and one that starts there
        raises `ReadError` OFFSET_NOT_YET_AVAILABLE; with it, it waits for new appends."""
        served = False
        while not end_offset or offset < end_offset:
            offset, frag, in_spool = self._locate(offset)
            if frag is None:
                if self._in_gap(offset) and await self._refresh_for_gap():
                    continue  # peers may have persisted it by now
                if served and not block:
                    return  # read through to the head: done
                if not block:
                    raise ReadError("OFFSET_NOT_YET_AVAILABLE",
                                    f"offset {offset} is at or beyond the write head "
                                    f"{self.write_head}")
                await self._wait_at(offset)
                continue
            limit = READ_CHUNK if not end_offset else min(READ_CHUNK, end_offset - offset)
            if in_spool:
                content = self._spool.read(offset, limit)
            else:
                content = await self._read_fragment(frag, offset, limit)
            READ_BYTES.inc(len(content))
            yield ReadChunk(offset, content, frag, self.write_head)
            offset += len(content)
            served = True

    async def _read_fragment(self, frag: Fragment, offset: int, size: int) -> bytes:
        path = self._closed.get((frag.begin, frag.end))
        if path is not None:
            try:
                return await asyncio.to_thread(_pread, path, offset - frag.begin, size)
            except FileNotFoundError:
                del self._closed[(frag.begin, frag.end)]  # persisted meanwhile
                persisted = self._index.find(self.spec.name, offset)
                if persisted is None or not persisted.backing_store:
                    raise
                frag = persisted
        if not frag.backing_store or self._store_for is None:
            raise ReadError("OFFSET_NOT_YET_AVAILABLE",
                            f"fragment {frag.path} is neither local nor persisted")
        store = self._store_for(frag.backing_store)
        try:
            cached = await self._cache.get(store, frag)
            return await asyncio.to_thread(_pread, cached, offset - frag.begin, size)
        except FileNotFoundError:  # evicted between fetch and read: fetch again
            cached = await self._cache.get(store, frag)
            return await asyncio.to_thread(_pread, cached, offset - frag.begin, size)

    async def run(self) -> None:
        """Roll the spool when its flush interval passes (even if no append comes),
        refresh from the stores every refresh interval, and, as a primary whose route
        changed, sync and announce it; run as a task the broker owns and cancels on
        shutdown. A failed refresh or sync is logged and tried again."""
        next_refresh = time.monotonic() + self.spec.fragment.refresh_interval.total_seconds()
        while True:
            interval = self.spec.fragment.flush_interval.total_seconds()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(interval, 1.0) if interval else 1.0):
                    await self._pulse.wait()
            if self._pulse.is_set():
                self._pulse.clear()
                if not await self.sync():
                    await asyncio.sleep(SYNC_RETRY_SECONDS)
                    self._pulse.set()
            if interval and self.is_primary and self._spool.should_roll(self.spec.fragment):
                await self.roll()
            if time.monotonic() >= next_refresh:
                next_refresh += self.spec.fragment.refresh_interval.total_seconds()
                try:
                    await self.refresh()
                except StoreError as exc:
                    log.warning("refreshing %s failed: %s", self.spec.name, exc)

    # -- a peer's side of replication --

    async def replicate(self, first: pb.ReplicateRequest,
                        requests: AsyncIterator[ReplicateContent],
                        reply: Callable[[pb.ReplicateResponse], Awaitable[None]]) -> None:
        """Serve a primary's Replicate stream whose route the caller verified is ours:
        answer its first proposal, then take content into the spool and commit (or
        drop) it at each proposal, until the stream ends or our route changes (then
        WRONG_ROUTE: the primary must sync under the new one)."""
        primary = self.resolution.route.primary_id if self.resolution else None
        # The newest stream wins: a primary opens one only after giving up the last
        # (which may linger, half-open, until keepalives notice).
        self._sessions += 1
        session = self._sessions
        self._wake_sessions()
        async with self._lock:
            if session != self._sessions:
                return  # superseded while waiting
            await reply(self._on_proposal(first))
            summer: ThreadedSha1 | None = None
            changed: asyncio.Future[Any] = asyncio.ensure_future(self._route_changed.wait())
            nxt: asyncio.Future[Any] | None = None
            try:
                while True:
                    if nxt is None:
                        nxt = asyncio.ensure_future(anext(requests))
                    await asyncio.wait({nxt, changed}, return_when=asyncio.FIRST_COMPLETED)
                    if changed.done():
                        if session != self._sessions:  # superseded by a newer stream
                            nxt.cancel()
                            self._spool.rollback()
                            return
                        # Another route: the session goes on only while its primary is
                        # still the primary (and we a member). It will sync under the
                        # new route after this append; another primary never commits
                        # through an old one's session.
                        if not self._serves(primary):
                            nxt.cancel()
                            self._spool.rollback()
                            await reply(pb.ReplicateResponse(status=pb.WRONG_ROUTE))
                            return
                        changed = asyncio.ensure_future(self._route_changed.wait())
                    if not nxt.done():
                        continue
                    try:
                        msg = nxt.result()
                    except StopAsyncIteration:
                        self._spool.rollback()
                        return
                    nxt = None
                    if msg.content:
                        spool = self._spool
                        if msg.meta.content_delta != spool.written - spool.end:
                            spool.rollback()
                            await reply(self._mismatch())
                            return
                        if summer is None:
                            summer = ThreadedSha1(self._hasher, also=[spool.pending_sum],
                                                  own=False)
                        spool.write(msg.content, summed=True)
                        await summer.update(msg.content)
                        continue
                    if summer is not None:
                        await summer.digest()
                        summer = None
                    if not self._serves(primary):
                        self._spool.rollback()
                        await reply(pb.ReplicateResponse(status=pb.WRONG_ROUTE))
                        return
                    answer = self._on_proposal(msg.meta)
                    if msg.meta.acknowledge or answer.status != pb.OK:
                        await reply(answer)
                    if answer.status != pb.OK:
                        return
            except BaseException:
                self._spool.rollback()
                raise
            finally:
                changed.cancel()
                if nxt is not None:
                    nxt.cancel()

    def _wake_sessions(self) -> None:
        """Have peer sessions check whether they may go on (route changed, or a newer
        session came)."""
        self._route_changed.set()
        self._route_changed = asyncio.Event()

    def _serves(self, primary: ProcessId | None) -> bool:
        """Whether a peer session of `primary` may go on under the current route."""
        res, peering = self.resolution, self._peering
        return res is not None and peering is not None and primary is not None and \
            res.route.primary_id == primary and peering.me in res.route.members

    def _on_proposal(self, request: pb.ReplicateRequest) -> pb.ReplicateResponse:
        """Commit the pending content if the proposal is the spool extended by it; drop
        it if the proposal is the spool as committed; roll to it if it is an empty
        fragment at or past our end; otherwise PROPOSAL_MISMATCH with what we hold."""
        proposal = fragment_from_pb(request.proposal, "proposal")
        spool = self._spool
        if spool.written != spool.end:
            if _same(proposal, spool.pending):
                REPLICATED_BYTES.inc(spool.written - spool.end)
                spool.commit()
                self._index.add_local(spool.fragment)
                self.registers = labels_from_pb(request.registers, "registers")
                return pb.ReplicateResponse(status=pb.OK)
            spool.rollback()
        if _same(proposal, spool.fragment):
            self.registers = labels_from_pb(request.registers, "registers")
            return pb.ReplicateResponse(status=pb.OK)
        if proposal.begin == proposal.end and proposal.begin >= spool.end:
            self._roll_to(proposal.begin, proposal.codec)
            self.registers = labels_from_pb(request.registers, "registers")
            return pb.ReplicateResponse(status=pb.OK)
        return self._mismatch()

    def _mismatch(self) -> pb.ReplicateResponse:
        return pb.ReplicateResponse(status=pb.PROPOSAL_MISMATCH,
                                    fragment=fragment_to_pb(self._spool.fragment),
                                    registers=labels_to_pb(self.registers))

    def update_spec(self, spec: JournalSpec) -> None:
        """A new revision of the spec. A changed codec or store takes effect with the
        next fragment: the spool rolls before the next append."""
        if (spec.fragment.compression_codec != self.spec.fragment.compression_codec
                or spec.fragment.stores != self.spec.fragment.stores):
            self._roll_requested = True
        self.spec = spec


def _same(a: Fragment, b: Fragment) -> bool:
    return (a.begin, a.end, a.sha1) == (b.begin, b.end, b.sha1)


def _pread(path: Path, offset: int, size: int) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read(size)
