"""The persister: uploads closed spools to their journal's first store.

A closed spool stays on local disk until its upload succeeds, and uploads are retried
with backoff for as long as the store fails, so a store outage delays persistence but
loses nothing. Compression runs in a worker thread, a block at a time into a file beside
the spool (a fragment may be 512 MiB: it is never held in memory), and the file is
uploaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
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

RETRY_INITIAL, RETRY_MAX = 0.2, 30.0

OnPersisted = Callable[[Fragment], None]


class Persister:
    """Uploads closed spools, one at a time, in the order they were closed."""

    def __init__(self, on_persisted: OnPersisted | None = None,
                 retry_initial: float = RETRY_INITIAL, retry_max: float = RETRY_MAX) -> None:
        self._queue: asyncio.Queue[tuple[ClosedSpool, FragmentStore]] = asyncio.Queue()
        self._on_persisted = on_persisted
        self._retry_initial, self._retry_max = retry_initial, retry_max
        self._idle = asyncio.Event()
        self._idle.set()

    def enqueue(self, spool: ClosedSpool, store: FragmentStore) -> None:
        """Persist `spool` to `store` (its journal's first store). Never blocks: closed
        spools are already on disk, so the queue holds only references."""
        self._idle.clear()
        self._queue.put_nowait((spool, store))
        PENDING.set(self._queue.qsize())

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
            spool, store = await self._queue.get()
            await self._persist(spool, store)
            PENDING.set(self._queue.qsize())
            if self._queue.empty():
                self._idle.set()

    async def _persist(self, spool: ClosedSpool, store: FragmentStore) -> None:
        frag = spool.fragment
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
