"""The persister: uploads closed spools to their journal's first store.

A closed spool stays on local disk until its upload succeeds. Uploads run a few at a time
(`concurrency`, and at most `per_store` to any one store, one to a local ``file://``
store, so a slow store cannot take every slot), and each failed upload is retried on
its own with a growing, jittered delay: a failing store delays only its own fragments,
while other stores' keep flowing.
Each store's health (pending fragments and bytes, whether its last upload failed and
why) is kept for metrics and for `gazctl journals fragments`. Compression runs in a worker
thread, a block at a time into a file beside the spool (a fragment may be 512 MiB: it is
never held in memory), once per fragment however often its upload is retried.

Every replica of a journal closes the same fragments. The primary uploads at once; a
peer enqueues its copy `if_missing_after` a delay, and then uploads it only if the store
does not hold it yet (its primary died first, say): one upload per fragment normally,
and no fragment lost when the primary goes. `flush()` makes held copies due now (on
shutdown).

Disk is bounded: `max_pending_bytes` of closed spools may wait for one store; past that,
the broker's appends to journals of that store wait for room (`wait_for_room`) and are
then refused, rather than filling the disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from prometheus_client import Counter, Gauge

from gazette.fragment.codec import Compressor
from gazette.fragment.fragment import Fragment
from gazette.fragment.spool import ClosedSpool
from gazette.fragment.store.base import FragmentStore, SealedFile, StoreError
from gazette.protocol import CompressionCodec

log = logging.getLogger(__name__)

PERSISTED = Counter("gazette_fragments_persisted_total", "Fragments uploaded to stores")
PERSIST_FAILURES = Counter("gazette_fragment_persist_failures_total",
                           "Failed fragment uploads (each retried later)", ["store"])
PENDING = Gauge("gazette_fragments_pending_persist", "Closed spools waiting for upload")
PENDING_BYTES = Gauge("gazette_fragments_pending_persist_bytes",
                      "Bytes of closed spools waiting for upload to a store", ["store"])
PENDING_BUDGET = Gauge("gazette_fragments_pending_persist_budget_bytes",
                       "Bytes of closed spools that may wait for one store before appends "
                       "to its journals are refused (the broker's --broker.max-unpersisted-bytes)")
STORE_FAILING = Gauge("gazette_store_failing",
                      "1 while a store's last upload failed, else 0", ["store"])
ALREADY_STORED = Counter("gazette_fragments_already_stored_total",
                         "Peer copies of fragments found already persisted (not uploaded)")
LOST = Counter("gazette_fragments_lost_total",
               "Closed spools whose local file vanished before they were persisted")

RETRY_INITIAL, RETRY_MAX = 0.2, 10.0
#: Uploads at once, in all and to one store; to one local-disk (``file://``) store they
#: go one at a time: measured, a second one only slowed appends to the same disk.
CONCURRENCY, PER_STORE, PER_FILE_STORE = 4, 2, 1
#: Bytes of closed spools that may wait for one store before appends to it wait.
DEFAULT_MAX_PENDING_BYTES = 4 << 30

OnPersisted = Callable[[Fragment], None]


@dataclass(eq=False)
class _Upload:
    spool: ClosedSpool
    store: FragmentStore
    if_missing: bool  # a peer's copy: uploaded only if the store lacks it
    on_persisted: OnPersisted | None
    due: float  # monotonic time it may be tried next
    delay: float = RETRY_INITIAL
    stored: Path | None = None  # the file to upload, once compressed
    error: str = ""  # why the last attempt failed
    running: bool = False

    @property
    def size(self) -> int:
        return self.spool.fragment.size


@dataclass
class StoreHealth:
    """What is known of one store's uploads."""

    url: str
    pending: int = 0
    pending_bytes: int = 0
    in_flight: int = 0
    failing: bool = False
    last_error: str = ""
    last_success: float = 0.0  # Unix seconds
    room: asyncio.Event = field(default_factory=asyncio.Event)


class Persister:
    """Uploads closed spools; run `run()` as a task until cancelled."""

    def __init__(self, on_persisted: OnPersisted | None = None,
                 retry_initial: float = RETRY_INITIAL, retry_max: float = RETRY_MAX,
                 concurrency: int = CONCURRENCY, per_store: int = PER_STORE,
                 max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES) -> None:
        """`on_persisted`: called for fragments enqueued without a callback of their own."""
        self._on_persisted = on_persisted
        self._uploads: list[_Upload] = []
        self._by_fragment: dict[tuple[str, int, int], _Upload] = {}
        self._stores: dict[str, StoreHealth] = {}
        self._wake = asyncio.Event()
        self._retry_initial, self._retry_max = retry_initial, retry_max
        self.concurrency, self.per_store = concurrency, per_store
        self.max_pending_bytes = max_pending_bytes
        PENDING_BUDGET.set(max_pending_bytes)
        self._idle = asyncio.Event()
        self._idle.set()

    def enqueue(self, spool: ClosedSpool, store: FragmentStore,
                if_missing_after: float | None = None,
                on_persisted: OnPersisted | None = None) -> None:
        """Persist `spool` to `store` (its journal's first store); with
        `if_missing_after`, only that many seconds later and only if the store does not
        hold it by then. `on_persisted(fragment)` is called once it is stored. Never
        blocks: closed spools are already on disk, so only references are held."""
        now = time.monotonic()
        upload = _Upload(spool, store, if_missing_after is not None,
                         on_persisted or self._on_persisted,
                         now + (if_missing_after or 0.0), self._retry_initial)
        self._uploads.append(upload)
        f = spool.fragment
        self._by_fragment[(f.journal, f.begin, f.end)] = upload
        health = self.health(store.url)
        health.pending += 1
        health.pending_bytes += upload.size
        self._changed(health)
        self._idle.clear()
        self._wake.set()

    def flush(self, journal: str | None = None) -> None:
        """Make every held peer copy, and every retry, due now (of `journal` only, if
        given: a replica that became its primary answers for content only it may hold)."""
        now = time.monotonic()
        for upload in self._uploads:
            if journal is None or upload.spool.fragment.journal == journal:
                upload.due = min(upload.due, now)
        self._wake.set()

    @property
    def idle(self) -> bool:
        """Whether everything enqueued is persisted."""
        return self._idle.is_set()

    async def wait_idle(self) -> None:
        """Return once every enqueued spool is persisted."""
        await self._idle.wait()

    def health(self, url: str) -> StoreHealth:
        health = self._stores.get(url)
        if health is None:
            health = self._stores[url] = StoreHealth(url)
            health.room.set()
            PERSIST_FAILURES.labels(url)  # exported at 0: alerts see the first failure
            self._changed(health)
        return health

    def stores(self) -> list[StoreHealth]:
        return list(self._stores.values())

    def error_of(self, fragment: Fragment) -> str:
        """Why the upload of a closed, not yet persisted `fragment` last failed ("" if
        it did not fail, or is not waiting)."""
        upload = self._by_fragment.get((fragment.journal, fragment.begin, fragment.end))
        return upload.error if upload is not None else ""

    def has_room(self, url: str) -> bool:
        """Whether closed spools waiting for store `url` are within the byte budget."""
        health = self._stores.get(url)
        return health is None or health.room.is_set()

    async def wait_for_room(self, url: str, timeout: float) -> bool:
        """Wait (at most `timeout` seconds) until store `url` is within its budget;
        returns whether it is."""
        health = self.health(url)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await health.room.wait()
        return health.room.is_set()

    def _changed(self, health: StoreHealth) -> None:
        if health.pending_bytes < self.max_pending_bytes:
            health.room.set()
        else:
            health.room.clear()
        PENDING.set(len(self._uploads))
        PENDING_BYTES.labels(health.url).set(health.pending_bytes)
        STORE_FAILING.labels(health.url).set(1 if health.failing else 0)

    async def run(self) -> None:
        """Upload until cancelled: the earliest due uploads first, within the limits on
        concurrency. An unexpected error (a bug) ends it: its owner treats that as
        fatal."""
        running: set[asyncio.Task[None]] = set()
        try:
            while True:
                self._wake.clear()
                now = time.monotonic()
                # (No loop variable: an upload's callback, and so its replica, must not
                # outlive its upload in this frame.)
                running.update(asyncio.create_task(self._attempt(u))
                               for u in self._next(now, len(running)))
                if not self._uploads:
                    self._idle.set()
                later = [u.due for u in self._uploads if u.due > now and not u.running]
                wait = min(later) - now if later else None
                woken = asyncio.ensure_future(self._wake.wait())
                done, _ = await asyncio.wait({woken, *running}, timeout=wait,
                                             return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
                finished = [t for t in running if t in done]
                running.difference_update(finished)
                del done
                for result in [t.exception() for t in finished]:
                    if result is not None:
                        raise result  # a bug in an attempt is fatal
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    def _next(self, now: float, in_flight: int) -> list[_Upload]:
        """Uploads to start now: due, not running, within the limits; earliest first."""
        out: list[_Upload] = []
        for upload in sorted((u for u in self._uploads if u.due <= now and not u.running),
                             key=lambda u: u.due):
            if in_flight + len(out) >= self.concurrency:
                break
            health = self.health(upload.store.url)
            limit = PER_FILE_STORE if upload.store.url.startswith("file:") else self.per_store
            if health.in_flight >= limit:
                continue
            health.in_flight += 1
            upload.running = True
            out.append(upload)
        return out

    async def _attempt(self, upload: _Upload) -> None:
        health = self.health(upload.store.url)
        frag = upload.spool.fragment
        try:
            if upload.if_missing and await self._stored(upload.store, frag):
                ALREADY_STORED.inc()
                await self._done(upload, upload.spool.path)
                return
            if upload.stored is None:
                upload.stored = await asyncio.to_thread(_compressed_file, upload.spool.path,
                                                        frag)
            # Sealed: neither the closed spool nor its compressed copy changes again.
            await upload.store.put(frag, SealedFile(upload.stored))
        except FileNotFoundError as exc:
            if upload.stored is None or not upload.stored.exists():
                LOST.inc()
                log.error("cannot persist %s: its local file is gone (%s); the fragment "
                          "is lost here (other replicas may hold it)", frag.path, exc)
                self._forget(upload)
                return
            self._failed(upload, health, exc)
        except (StoreError, OSError) as exc:
            self._failed(upload, health, exc)
        else:
            PERSISTED.inc()
            if upload.if_missing:
                log.info("persisted %s: a peer's copy the store lacked", frag.path)
            health.failing, health.last_success = False, time.time()
            await self._done(upload, upload.stored)
        finally:
            upload.running = False
            health.in_flight -= 1
            self._changed(health)
            self._wake.set()

    def _failed(self, upload: _Upload, health: StoreHealth, exc: BaseException) -> None:
        PERSIST_FAILURES.labels(health.url).inc()
        upload.error = health.last_error = f"{type(exc).__name__}: {exc}"
        health.failing = True
        wait = upload.delay * random.uniform(0.5, 1.5)
        upload.due = time.monotonic() + wait
        upload.delay = min(upload.delay * 2, self._retry_max)
        log.warning("persisting %s failed (%s); retrying in %.1fs", upload.spool.fragment.path,
                    upload.error, wait)

    async def _stored(self, store: FragmentStore, frag: Fragment) -> bool:
        try:
            return await store.exists(frag)
        except StoreError as exc:
            log.warning("checking for %s failed (%s); uploading it", frag.path, exc)
            return False

    async def _done(self, upload: _Upload, stored: Path) -> None:
        frag = upload.spool.fragment
        try:
            if upload.on_persisted is not None:
                # First: readers find the persisted copy before the local file goes. (The
                # store's mod time is learned at the next listing; now is within a second.)
                upload.on_persisted(replace(frag, backing_store=upload.store.url,
                                            mod_time=int(time.time())))
            for path in {stored, upload.spool.path}:
                with contextlib.suppress(FileNotFoundError):
                    await asyncio.to_thread(path.unlink)
        finally:
            # Last: `wait_idle` returns only once the local files are gone.
            self._forget(upload)

    def _forget(self, upload: _Upload) -> None:
        self._uploads.remove(upload)
        f = upload.spool.fragment
        if self._by_fragment.get((f.journal, f.begin, f.end)) is upload:
            del self._by_fragment[(f.journal, f.begin, f.end)]
        health = self.health(upload.store.url)
        health.pending -= 1
        health.pending_bytes -= upload.size
        self._changed(health)


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
