"""A journal's replica on this broker: where appends are sequenced and written.

Appends to one journal run one at a time (an `asyncio.Lock`), so two appends never
interleave; each is written into the spool as its chunks arrive and committed only when
the client ends it cleanly. A client that disconnects, an expected offset that is not the
write head, registers that do not match, or an append over the size limit leave nothing
behind (the spool rolls back). Registers are labels an append can test and change
atomically: the consumer's recovery log fences out stale writers with them.

The spool rolls to a new fragment before an append once it reached the spec's length or
flush interval; closed spools go to the persister for the spec's first store.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from prometheus_client import Counter

from gazette.errors import GazetteError
from gazette.fragment import Fragment, FragmentIndex, Persister, Spool
from gazette.fragment.cache import FragmentCache
from gazette.fragment.store import FragmentStore, StoreError
from gazette.fragment.summer import ThreadedSha1
from gazette.labels import LabelSet, Selector
from gazette.protocol import JournalSpec

log = logging.getLogger(__name__)

APPENDS = Counter("gazette_broker_appends_total", "Appends answered, by status", ["status"])
APPEND_BYTES = Counter("gazette_broker_append_bytes_total", "Bytes of committed appends")
READ_BYTES = Counter("gazette_broker_read_bytes_total", "Bytes served to readers")
ROLLS = Counter("gazette_broker_fragments_rolled_total", "Spools closed into fragments")

#: Largest append accepted unless the broker is configured otherwise.
DEFAULT_MAX_APPEND_SIZE = 256 << 20


class StatusError(GazetteError):
    """A refusal the protocol names: `status` is a broker `Status` name."""

    def __init__(self, status: str, message: str) -> None:
        self.status = status
        super().__init__(f"{status}: {message}")


class AppendError(StatusError):
    """An append was refused; nothing was written."""


class ReadError(StatusError):
    """A read that cannot be served (yet)."""


@dataclass(frozen=True, slots=True)
class ReadChunk:
    """Content of the journal from `offset`, out of `fragment`."""

    offset: int
    content: bytes
    fragment: Fragment
    write_head: int


#: Largest chunk a read yields at once (large messages are cheaper per byte over gRPC).
READ_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class AppendResult:
    """The committed append: its fragment (begin, end, SHA-1 of its own content) and the
    journal's registers after it."""

    commit: Fragment
    registers: LabelSet


class Replica:
    """The primary replica of one journal on this broker."""

    def __init__(self, spec: JournalSpec, spool_dir: Path, index: FragmentIndex,
                 persister: Persister | None = None,
                 store_for: Callable[[str], FragmentStore] | None = None,
                 max_append_size: int = DEFAULT_MAX_APPEND_SIZE,
                 hasher: Executor | None = None) -> None:
        """`hasher` (one thread) sums appends' SHA-1s (their own and the spool's)
        beside the loop; without it, the loop sums them."""
        self.spec = spec
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
                   hasher: Executor | None = None) -> Replica:
        """A replica whose write head continues after the journal's persisted content:
        the stores are listed first (a fresh broker serves old content after one
        listing)."""
        replica = cls(spec, spool_dir, index, persister, store_for, max_append_size, hasher)
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
            if offset is not None and offset != self.write_head:
                raise AppendError("WRONG_APPEND_OFFSET",
                                  f"expected offset {offset}, write head is {self.write_head}")
            if check_registers is not None and not check_registers.matches(self.registers):
                raise AppendError("REGISTER_MISMATCH", f"registers {self.registers!r} do not "
                                  f"match {check_registers}")
            self._maybe_roll()
            spool, begin, size = self._spool, self.write_head, 0
            # The append's own SHA-1 and the spool's, summed on the hasher's thread.
            sha1 = ThreadedSha1(self._hasher, also=[spool.pending_sum])
            try:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > self.max_append_size:
                        raise AppendError("NOT_ALLOWED", f"append is larger than the "
                                          f"{self.max_append_size}-byte limit")
                    spool.write(chunk, summed=True)
                    await sha1.update(chunk)
                    await self._throttle(len(chunk))
                digest = await sha1.digest()
            except BaseException:
                # The spool's pending sum is dropped: chunks the thread may still be
                # summing into it change nothing.
                spool.rollback()
                raise
            spool.commit()
            self._index.add_local(spool.fragment)
            if union_registers:
                self.registers = self.registers | union_registers
            if subtract_registers:
                self.registers = self.registers - subtract_registers
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

    def _maybe_roll(self) -> None:
        if self._roll_requested or self._spool.should_roll(self.spec.fragment):
            self._roll()

    async def roll(self) -> Fragment | None:
        """Close the spool (if it holds anything) and start a new one at the write head,
        between appends; the closed fragment goes to the persister and is returned."""
        async with self._lock:
            return self._roll()

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
            self._persister.enqueue(closed, self._store_for(stores[0]))
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
        if found is None or found.begin >= spool.begin:
            # A hole reaching up to the open spool: the read goes on from there (and
            # waits there, if the spool is still empty).
            offset = spool.begin
            return (offset, spool.fragment, True) if spool.end > offset else \
                (offset, None, False)
        return max(offset, found.begin), found, False

    async def locate(self, offset: int, *, block: bool = False) -> tuple[int, Fragment]:
        """The offset a read at `offset` starts from and the fragment holding it (for
        metadata-only reads). Without `block`, `ReadError` OFFSET_NOT_YET_AVAILABLE at
        the write head; with it, waits for the next append."""
        while True:
            offset, frag, _ = self._locate(offset)
            if frag is not None:
                return offset, frag
            if not block:
                raise ReadError("OFFSET_NOT_YET_AVAILABLE", f"offset {offset} is at or "
                                f"beyond the write head {self.write_head}")
            await self._index.wait_for(self.spec.name, offset)

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
                if served and not block:
                    return  # read through to the head: done
                if not block:
                    raise ReadError("OFFSET_NOT_YET_AVAILABLE",
                                    f"offset {offset} is at or beyond the write head "
                                    f"{self.write_head}")
                await self._index.wait_for(self.spec.name, offset)
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
        """Roll the spool when its flush interval passes (even if no append comes) and
        refresh from the stores every refresh interval; run as a task the broker owns
        and cancels on shutdown. A failed refresh is logged and retried next interval."""
        next_refresh = time.monotonic() + self.spec.fragment.refresh_interval.total_seconds()
        while True:
            interval = self.spec.fragment.flush_interval.total_seconds()
            await asyncio.sleep(min(interval, 1.0) if interval else 1.0)
            if interval and self._spool.should_roll(self.spec.fragment):
                await self.roll()
            if time.monotonic() >= next_refresh:
                next_refresh += self.spec.fragment.refresh_interval.total_seconds()
                try:
                    await self.refresh()
                except StoreError as exc:
                    log.warning("refreshing %s failed: %s", self.spec.name, exc)

    def update_spec(self, spec: JournalSpec) -> None:
        """A new revision of the spec. A changed codec or store takes effect with the
        next fragment: the spool rolls before the next append."""
        if (spec.fragment.compression_codec != self.spec.fragment.compression_codec
                or spec.fragment.stores != self.spec.fragment.stores):
            self._roll_requested = True
        self.spec = spec


def _pread(path: Path, offset: int, size: int) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read(size)
