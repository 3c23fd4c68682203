"""The persister: uploads closed spools to their journal's first store.

A closed spool stays on local disk until its upload succeeds, and uploads are retried
with backoff for as long as the store fails, so a store outage delays persistence but
loses nothing. Compression runs in a worker thread, a block at a time into a file beside
the spool (a fragment may be 512 MiB: it is never held in memory), and the file is
uploaded.

Every replica of a journal closes the same fragments. The primary uploads at once; a
peer enqueues its copy `if_missing_after` a delay, and then uploads it only if the store
does not hold it yet (its primary died first, say): one upload per fragment normally,
and no fragment lost when the primary goes. `flush()` makes held copies due now (on
shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from prometheus_client import Counter, Gauge

from gazette.fragment.codec import Compressor
from gazette.fragment.fragment import Fragment
from gazette.fragment.spool import ClosedSpool
from gazette.fragment.store.base import FragmentStore, StoreError
from gazette.protocol import CompressionCodec

log = logging.getLogger(__name__)

PERSISTED = Counter("gazette_fragments_persisted_total", "Fragments uploaded to stores")
PERSIST_FAILURES = Counter("gazette_fragment_persist_failures_total",
                           "Failed fragment uploads (retried)")
PENDING = Gauge("gazette_fragments_pending_persist", "Closed spools waiting for upload")
ALREADY_STORED = Counter("gazette_fragments_already_stored_total",
                         "Peer copies of fragments found already persisted (not uploaded)")

RETRY_INITIAL, RETRY_MAX = 0.2, 30.0

OnPersisted = Callable[[Fragment], None]


class Persister:
    """Uploads closed spools, one at a time, in the order they were closed."""

    def __init__(self, on_persisted: OnPersisted | None = None,
                 retry_initial: float = RETRY_INITIAL, retry_max: float = RETRY_MAX) -> None:
        #: Spools to upload now: (spool, store, only if the store lacks it).
        self._queue: deque[tuple[ClosedSpool, FragmentStore, bool]] = deque()
        #: Peer copies held until their time: (due, spool, store), in enqueue order.
        self._held: deque[tuple[float, ClosedSpool, FragmentStore]] = deque()
        self._wake = asyncio.Event()
        self._on_persisted = on_persisted
        self._retry_initial, self._retry_max = retry_initial, retry_max
        self._idle = asyncio.Event()
        self._idle.set()

    def enqueue(self, spool: ClosedSpool, store: FragmentStore,
                if_missing_after: float | None = None) -> None:
        """Persist `spool` to `store` (its journal's first store); with
        `if_missing_after`, only that many seconds later and only if the store does not
        hold it by then. Never blocks: closed spools are already on disk, so the queue
        holds only references."""
        self._idle.clear()
        if if_missing_after is None:
            self._queue.append((spool, store, False))
        else:
            self._held.append((time.monotonic() + if_missing_after, spool, store))
        self._wake.set()
        PENDING.set(len(self._queue) + len(self._held))

    def flush(self) -> None:
        """Make every held peer copy due now."""
        while self._held:
            _, spool, store = self._held.popleft()
            self._queue.append((spool, store, True))
        self._wake.set()

    @property
    def idle(self) -> bool:
        """Whether everything enqueued is persisted."""
        return self._idle.is_set()

    async def wait_idle(self) -> None:
        """Return once every enqueued spool is persisted."""
        await self._idle.wait()

    async def run(self) -> None:
        """Upload until cancelled."""
        while True:
            now = time.monotonic()
            while self._held and self._held[0][0] <= now:
                _, spool, store = self._held.popleft()
                self._queue.append((spool, store, True))
            if self._queue:
                await self._persist(*self._queue.popleft())
                PENDING.set(len(self._queue) + len(self._held))
                continue
            if not self._held:
                self._idle.set()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._held[0][0] - now if self._held else None):
                    await self._wake.wait()

    async def _persist(self, spool: ClosedSpool, store: FragmentStore,
                       if_missing: bool = False) -> None:
        frag = spool.fragment
        if if_missing and await self._stored(store, frag):
            ALREADY_STORED.inc()
            await self._done(spool, spool.path, store)
            return
        stored = await asyncio.to_thread(_compressed_file, spool.path, frag)
        delay = self._retry_initial
        while True:
            try:
                await store.put(frag, stored)
                break
            except StoreError as exc:
                PERSIST_FAILURES.inc()
                log.warning("persisting %s failed (%s); retrying in %.1fs", frag.path, exc,
                            delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._retry_max)
        PERSISTED.inc()
        await self._done(spool, stored, store)

    async def _stored(self, store: FragmentStore, frag: Fragment) -> bool:
        try:
            return await store.exists(frag)
        except StoreError as exc:
            log.warning("checking for %s failed (%s); uploading it", frag.path, exc)
            return False

    async def _done(self, spool: ClosedSpool, stored: Path, store: FragmentStore) -> None:
        frag = spool.fragment
        for path in {stored, spool.path}:
            with contextlib.suppress(FileNotFoundError):
                await asyncio.to_thread(path.unlink)
        if self._on_persisted is not None:
            # The store's own mod time is learned at the next listing; now is within a second.
            self._on_persisted(replace(frag, backing_store=store.url,
                                       mod_time=int(time.time())))


#: Spool content compressed per step: memory stays bounded whatever the fragment's size.
COMPRESS_BLOCK = 4 << 20


def _compressed_file(path: Path, fragment: Fragment) -> Path:
    """The file to upload for the spool at `path`: the spool itself (codec NONE) or its
    content compressed, a block at a time, into a file beside it."""
    if fragment.codec is CompressionCodec.NONE:
        return path
    out = path.with_name(path.name + ".stored")
    compressor = Compressor(fragment.codec)
    with open(path, "rb") as src, open(out, "wb") as dst:
        while block := src.read(COMPRESS_BLOCK):
            compressor.feed(block)
            dst.write(compressor.drain())
        dst.write(compressor.finish())
    return out
