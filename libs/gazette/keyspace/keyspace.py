"""KeySpace: a local, decoded mirror of an etcd prefix, kept current by a watch.

It is loaded with one (paged) range read at a single revision, then follows a watch from
that revision + 1. When the watch stream or etcd itself drops, it re-creates the watch
from the last revision it applied, so no event is missed or applied twice; if etcd
compacted past that revision, it reloads the prefix whole. Readers see every change in
revision order and can wait until the mirror reflects a revision they wrote at.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import heapq
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc
from prometheus_client import Counter, Gauge

from gazette.keyspace.etcd import (
    STREAM_ERRORS,
    Etcd,
    EtcdError,
    Event,
    KeyValue,
    iterate_stream,
)
from gazette.supervise import cancel_and_wait

log = logging.getLogger(__name__)

V = TypeVar("V")

RETRY_INITIAL, RETRY_MAX = 0.1, 2.0
#: While someone waits for a revision, ask etcd for watch progress this often.
PROGRESS_REQUEST_INTERVAL = 0.5
#: An idle watch asks for progress this often, and is started again when it answered
#: nothing for this long.
WATCH_PROGRESS_SECONDS, WATCH_STALL_SECONDS = 5.0, 20.0


KEYSPACE_REVISION = Gauge(
    "gazette_keyspace_revision", "etcd revision a keyspace mirror reflects", ["prefix"])
KEYSPACE_KEYS = Gauge("gazette_keyspace_keys", "Keys held by a keyspace mirror", ["prefix"])
KEYSPACE_WATCH_RESTARTS = Counter(
    "gazette_keyspace_watch_restarts_total", "Watches of a keyspace re-created after failure",
    ["prefix"])
KEYSPACE_DECODE_ERRORS = Counter(
    "gazette_keyspace_decode_errors_total", "Values a keyspace skipped as undecodable",
    ["prefix"])
KEYSPACE_RELOADS = Counter(
    "gazette_keyspace_reloads_total", "Full reloads of a keyspace (start and compactions)",
    ["prefix"])


def _after(prefix: str) -> str:
    """The least string greater than every string that starts with `prefix`."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


@dataclass(frozen=True, slots=True)
class Entry(Generic[V]):
    """A key of the mirror: its decoded value and the etcd metadata behind it."""

    kv: KeyValue
    value: V

    @property
    def key(self) -> str:
        return self.kv.key

    @property
    def mod_revision(self) -> int:
        return self.kv.mod_revision


Decoder = Callable[[KeyValue], V]
Observer = Callable[[int, list[Event]], None]


class KeySpace(Generic[V]):
    """A mirror of every key under `prefix`, decoded by `decode`.

    Keys whose value cannot be decoded are left out (and counted in `decode_errors`): one
    bad value written by hand must not stop a broker. Run `watch()` as a task, or use
    ``async with keyspace:`` which loads, starts and finally cancels the watch.
    """

    def __init__(self, etcd: Etcd, prefix: str, decode: Decoder[V]) -> None:
        self.etcd = etcd
        self.prefix = prefix
        self.decode = decode
        for counter in (KEYSPACE_RELOADS, KEYSPACE_WATCH_RESTARTS, KEYSPACE_DECODE_ERRORS):
            counter.labels(prefix)  # exported at 0: alerts and panels see the first
        #: The etcd revision this mirror reflects: every change at or below it is applied.
        self.revision = 0
        #: The highest revision etcd is known to have reached (response headers): at
        #: least `revision`, maybe more (changes outside the prefix).
        self.etcd_revision = 0
        self.decode_errors = 0
        self.watch_restarts = 0
        self._entries: dict[str, Entry[V]] = {}
        self._keys: list[str] = []
        self._undecodable: set[str] = set()
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._waiter_seq = 0
        self._observers: list[Observer] = []
        self._call: Any = None
        self._last_response = 0.0
        self._write_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    # -- reading the mirror --

    def get(self, key: str) -> Entry[V] | None:
        return self._entries.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry[V]]:
        """Entries in key order."""
        return (self._entries[k] for k in list(self._keys))

    def prefixed(self, prefix: str) -> list[Entry[V]]:
        """Entries whose key starts with `prefix`, in key order (two binary searches:
        the cost is that of what is found, however many keys there are)."""
        keys = self._keys
        lo = bisect.bisect_left(keys, prefix)
        hi = bisect.bisect_left(keys, _after(prefix), lo) if prefix else len(keys)
        entries = self._entries
        return [entries[key] for key in keys[lo:hi]]

    def observe(self, observer: Observer) -> Callable[[], None]:
        """Call `observer(revision, events)` after each applied change (from the watch
        task; keep it quick). Returns a function that removes it. A reload after a
        compaction reports the events that bring the mirror to the new state."""
        self._observers.append(observer)
        return lambda: self._observers.remove(observer)

    # -- loading and watching --

    async def load(self) -> None:
        """Replace the mirror with the prefix as of now (one range read)."""
        result = await self.etcd.get_prefix(self.prefix)
        self.etcd_revision = max(self.etcd_revision, result.revision)
        KEYSPACE_RELOADS.labels(self.prefix).inc()
        old = self._entries
        self._entries, self._keys, self._undecodable = {}, [], set()
        for kv in result.kvs:
            self._upsert(kv)
        events = [Event(False, e.kv) for k, e in self._entries.items()
                  if k not in old or old[k].kv != e.kv]
        events += [Event(True, e.kv) for k, e in old.items() if k not in self._entries]
        self._advance(result.revision, events)

    async def watch(self) -> None:
        """Follow the prefix until cancelled, resuming after any stream or etcd failure."""
        if self.revision == 0:
            await self._retrying(self.load)
        delay = RETRY_INITIAL
        while True:
            try:
                async for _ in self._watch_stream():
                    delay = RETRY_INITIAL
            except STREAM_ERRORS as exc:
                detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else repr(exc)
                log.warning("watch of %s broke at revision %d (%s); resuming in %.1fs",
                            self.prefix, self.revision, detail, delay)
                self.watch_restarts += 1
            KEYSPACE_WATCH_RESTARTS.labels(self.prefix).inc()
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)

    async def _retrying(self, op: Callable[[], Any]) -> None:
        delay = RETRY_INITIAL
        while True:
            try:
                await op()
                return
            except EtcdError as exc:
                log.warning("loading %s failed (%s); retrying in %.1fs", self.prefix, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)

    async def _watch_stream(self) -> AsyncIterator[None]:
        """One watch stream from `revision + 1`; yields after each response. A stream
        that answers nothing, not even a requested progress notification, for
        `WATCH_STALL_SECONDS` is given up (etcd paused, a connection half-open)."""
        call = self.etcd.open_watch()
        self._call = call
        loop = asyncio.get_running_loop()
        self._last_response = loop.time()
        watchdog = asyncio.create_task(self._watchdog(call), name=f"watchdog:{self.prefix}")
        try:
            async with self._write_lock:
                await call.write(Etcd.watch_create_request(self.prefix, self.revision + 1))
            async for resp in iterate_stream(call):
                self._last_response = loop.time()
                self.etcd_revision = max(self.etcd_revision, int(resp.header.revision))
                if resp.compact_revision:
                    log.warning("watch of %s: revision %d was compacted (to %d); reloading",
                                self.prefix, self.revision + 1, resp.compact_revision)
                    await self.load()
                    return
                if resp.canceled:
                    raise EtcdError(f"watch of {self.prefix} canceled: {resp.cancel_reason}")
                if resp.created:
                    if self._waiters:
                        await self._request_progress()
                    continue
                if resp.events:
                    self._apply(resp)
                elif await self._quiet_through(int(resp.header.revision)):
                    self._advance(int(resp.header.revision), [])
                yield
            raise EtcdError(f"watch of {self.prefix} ended by etcd")
        except asyncio.CancelledError:
            # The watchdog's cancel of the call (not of this task): a stalled stream.
            task = asyncio.current_task()
            if watchdog.done() and not watchdog.cancelled() and watchdog.result() and \
                    task is not None and not task.cancelling():
                raise EtcdError(f"watch of {self.prefix} answered nothing for "
                                f"{WATCH_STALL_SECONDS:.0f}s") from None
            raise
        finally:
            watchdog.cancel()
            self._call = None
            call.cancel()

    async def _watchdog(self, call: Any) -> bool:
        """Ask for progress now and then; cancel `call` (returning True) once it has
        answered nothing for `WATCH_STALL_SECONDS`."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(WATCH_PROGRESS_SECONDS)
            if loop.time() - self._last_response > WATCH_STALL_SECONDS:
                log.warning("watch of %s answered nothing for %.0fs; starting it again",
                            self.prefix, loop.time() - self._last_response)
                call.cancel()
                return True
            await self._request_progress()

    async def _quiet_through(self, revision: int) -> bool:
        """Whether nothing under the prefix changed after our revision up to `revision`.

        A progress notification claims the watch has delivered everything through its
        revision, but etcd before 3.5.8 answers a requested progress from its control
        stream ahead of pending events. So before trusting one, check: at that revision,
        no key under the prefix has a newer mod revision than ours, and the key count
        equals ours (so no delete is pending either).
        """
        if revision <= self.revision:
            return False
        try:
            total, changed = await self.etcd.count_prefix(self.prefix, revision,
                                                          self.revision + 1)
        except EtcdError:
            return False
        return changed == 0 and total == len(self._entries) + len(self._undecodable)

    def _apply(self, resp: Any) -> None:
        events = Etcd.events_of(resp)
        base = self.revision
        applied = []
        for ev in events:
            if ev.kv.mod_revision <= base:
                continue  # already applied before a resume; never apply twice
            if ev.deleted:
                self._remove(ev.kv.key)
            else:
                self._upsert(ev.kv)
            applied.append(ev)
        self._advance(events[-1].kv.mod_revision, applied)

    def _upsert(self, kv: KeyValue) -> None:
        try:
            value = self.decode(kv)
        except Exception as exc:  # noqa: BLE001 - any bad value is skipped, not fatal
            self.decode_errors += 1
            KEYSPACE_DECODE_ERRORS.labels(self.prefix).inc()
            log.warning("skipping %s at revision %d: cannot decode: %s",
                        kv.key, kv.mod_revision, exc)
            self._remove(kv.key)
            self._undecodable.add(kv.key)
            return
        self._undecodable.discard(kv.key)
        if kv.key not in self._entries:
            bisect.insort(self._keys, kv.key)
        self._entries[kv.key] = Entry(kv, value)

    def _remove(self, key: str) -> None:
        self._undecodable.discard(key)
        if self._entries.pop(key, None) is not None:
            del self._keys[bisect.bisect_left(self._keys, key)]

    def _advance(self, revision: int, events: list[Event]) -> None:
        if revision < self.revision:
            return
        self.revision = revision
        KEYSPACE_REVISION.labels(self.prefix).set(revision)
        KEYSPACE_KEYS.labels(self.prefix).set(len(self._entries))
        for observer in list(self._observers):
            try:
                observer(revision, events)
            except Exception:
                log.exception("keyspace observer failed")
        while self._waiters and self._waiters[0][0] <= revision:
            _, _, fut = heapq.heappop(self._waiters)
            if not fut.done():
                fut.set_result(None)

    # -- waiting --

    async def wait_for_revision(self, revision: int, timeout: float | None = None) -> None:
        """Return once the mirror reflects `revision` (e.g. that of a write we made).

        Asks etcd for a watch progress notification, so a revision whose changes fall
        outside this prefix is noticed without waiting for the next event here.
        """
        if revision <= self.revision:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiter_seq += 1
        waiter = (revision, self._waiter_seq, fut)
        heapq.heappush(self._waiters, waiter)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        try:
            while not fut.done():
                await self._request_progress()
                wait = PROGRESS_REQUEST_INTERVAL
                if deadline is not None:
                    wait = min(wait, deadline - loop.time())
                    if wait <= 0:
                        raise TimeoutError(
                            f"keyspace {self.prefix} did not reach revision {revision} "
                            f"within {timeout}s (at {self.revision})"
                        )
                await asyncio.wait({fut}, timeout=wait)
        finally:
            fut.cancel()
            if not fut.done() or fut.cancelled():
                # Given up (a timeout, a cancelled caller): leave nothing behind.
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
                    heapq.heapify(self._waiters)

    async def current_revision(self, at_least: int = 0) -> int:
        """The revision etcd has reached, as far as known; asked of etcd (one read with
        a deadline) when `at_least` is beyond what is known, so that a caller can tell
        a revision etcd has reached from one it has not."""
        if at_least > self.etcd_revision:
            revision, _ = await self.etcd.get(self.prefix)
            self.etcd_revision = max(self.etcd_revision, revision)
        return max(self.etcd_revision, self.revision)

    async def _request_progress(self) -> None:
        call = self._call
        if call is None:
            return  # the next watch stream asks on creation
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            async with self._write_lock:
                await call.write(Etcd.watch_progress_request())

    # -- lifecycle --

    async def __aenter__(self) -> KeySpace[V]:
        await self.load()
        self._task = asyncio.create_task(self.watch(), name=f"keyspace-watch:{self.prefix}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
