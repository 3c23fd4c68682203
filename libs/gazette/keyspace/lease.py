"""etcd leases kept alive by a loop, with notice when the lease is lost.

A member's spec and its assignments live under its lease: while the process is alive the
keys stay, and when it dies they expire. A process must stop acting as a member the
moment its lease may be gone, since others may already have taken its work: `remaining`
is how long the lease lasts unrefreshed by our own clock (members stop acting on their
assignments before it runs out), and `lost` is set once etcd says the lease is gone.

Only etcd says that. While it does not answer, the keepalive goes on asking: etcd renews
every lease when it restarts (a lease of 5 s, etcd down 10 s, came back with 5 s left
and its keys kept), so a member cut off from a restarting etcd for longer than its TTL
is still a member once etcd answers; one etcd expired meanwhile (it was partitioned, or
frozen) hears so at its first answer and stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from types import TracebackType
from typing import Any

from prometheus_client import Counter

from gazette.keyspace.etcd import STREAM_ERRORS, Etcd, EtcdError, iterate_stream

log = logging.getLogger(__name__)

MIN_TTL = 2
#: How long leaving `async with Lease` waits for its keepalive task to stop.
STOP_TIMEOUT = 5.0
#: Seconds between keepalive attempts while etcd does not answer.
RETRY_SECONDS = 0.5
#: The least time a keepalive waits for etcd's answer (when the lease has less left by
#: our clock: after an etcd restart, its first answers come slowly).
ANSWER_SECONDS = 2.0

LEASES_LOST = Counter("gazette_leases_lost_total",
                      "Leases etcd said were expired or revoked by someone else")
LEASES_OVERDUE = Counter("gazette_leases_overdue_total",
                         "Times a lease went unrefreshed past its TTL by our own clock (etcd "
                         "unreachable), until etcd answered whether it is alive")


class LeaseLost(EtcdError):
    """The lease expired or was revoked; keys under it are gone."""


class Lease:
    """A granted lease. Use ``async with await Lease.grant(etcd, ttl) as lease``, or run
    `keep_alive()` as a task of your own."""

    def __init__(self, etcd: Etcd, lease_id: int, ttl: int) -> None:
        self.etcd = etcd
        self.id = lease_id
        self.ttl = ttl
        #: Set when etcd says the lease is gone (expired or revoked), or we revoked it.
        self.lost = asyncio.Event()
        self._expires_at = time.monotonic() + ttl
        self._refreshed = asyncio.Event()  # set (and replaced) at every refresh
        self._overdue_since: float | None = None  # our clock ran out, etcd not heard yet
        self._task: asyncio.Task[None] | None = None
        self._call: Any = None  # the keepalive stream, while one is open
        self._stopping = False  # set by __aexit__: the keepalive ends

    @classmethod
    async def grant(cls, etcd: Etcd, ttl: int) -> Lease:
        if ttl < MIN_TTL:
            raise ValueError(f"lease TTL must be at least {MIN_TTL}s, got {ttl}")
        lease_id, granted = await etcd.lease_grant(ttl)
        return cls(etcd, lease_id, granted)

    @property
    def remaining(self) -> float:
        """Seconds until the lease expires unless refreshed, as far as we know (negative:
        it may have expired; etcd has not answered since)."""
        return self._expires_at - time.monotonic()

    async def wait_refreshed(self) -> None:
        """Return at the next refresh (or when the lease is lost)."""
        waits = {asyncio.ensure_future(self._refreshed.wait()),
                 asyncio.ensure_future(self.lost.wait())}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def keep_alive(self) -> None:
        """Refresh every TTL/4 until cancelled; sets `lost` and raises `LeaseLost` when
        etcd says the lease is gone. While etcd does not answer it tries again every
        `RETRY_SECONDS`, however long that takes: `remaining` (our clock) runs out
        meanwhile, and the lease's holder stops acting on it, but only etcd's answer
        ends the lease. (A lease is surely held through a stall of TTL minus the
        refresh interval: 3 s at the default TTL of 4 s.)"""
        interval = max(self.ttl / 4, 0.5)
        while not self.lost.is_set():
            try:
                await self._keep_alive_stream(interval)
            except STREAM_ERRORS as exc:
                if isinstance(exc, LeaseLost):
                    raise
                if self._stopping:
                    return
                if self.remaining > 0:
                    log.warning("lease %x keepalive failed (%s); %.1fs left", self.id, exc,
                                self.remaining)
                elif self._overdue_since is None:
                    self._overdue_since = time.monotonic()
                    LEASES_OVERDUE.inc()
                    log.error("lease %x was not refreshed before its TTL ran out (%s): "
                              "its holder stops acting on it, and asks etcd until etcd "
                              "says whether it is alive", self.id, exc)
                await asyncio.sleep(RETRY_SECONDS)
        raise LeaseLost(f"lease {self.id:x} is lost")

    async def _keep_alive_stream(self, interval: float) -> None:
        call = self._call = self.etcd.lease_keepalive_stream()
        try:
            responses = iterate_stream(call)
            while True:
                sent_at = time.monotonic()
                await call.write(Etcd.lease_keepalive_request(self.id))
                resp = await asyncio.wait_for(anext(responses),
                                              timeout=max(self.remaining, ANSWER_SECONDS))
                if resp.TTL <= 0:
                    self._mark_lost("etcd reports it expired or revoked")
                    raise LeaseLost(f"lease {self.id:x} expired or was revoked")
                self._expires_at = sent_at + resp.TTL
                if self._overdue_since is not None:
                    log.warning("lease %x is alive: etcd answered %.1fs after the lease "
                                "ran out by our clock, with %ds left", self.id,
                                sent_at - self._overdue_since, resp.TTL)
                    self._overdue_since = None
                self._refreshed.set()
                self._refreshed = asyncio.Event()
                await asyncio.sleep(interval)
        except (StopAsyncIteration, TimeoutError):
            raise EtcdError("keepalive stream ended") from None
        finally:
            call.cancel()
            self._call = None

    def _mark_lost(self, why: str, level: int = logging.ERROR) -> None:
        if not self.lost.is_set():
            log.log(level, "lease %x lost: %s", self.id, why)
            if level >= logging.ERROR:
                LEASES_LOST.inc()
            self.lost.set()

    async def revoke(self) -> None:
        """Give the lease up now, deleting its keys."""
        with contextlib.suppress(EtcdError):
            await self.etcd.lease_revoke(self.id)
        self._mark_lost("revoked by us", logging.INFO)

    async def __aenter__(self) -> Lease:
        self._task = asyncio.create_task(self._run(), name=f"lease-keepalive:{self.id:x}")
        return self

    async def _run(self) -> None:
        with contextlib.suppress(LeaseLost):
            await self.keep_alive()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._task is not None:
            # grpc.aio may swallow a task's cancellation (a task cancelled inside a stream
            # write was seen to never finish, 1 run in ~20): so the loop is also told to
            # stop, its stream is cancelled, and the wait is bounded.
            self._stopping = True
            if self._call is not None:
                self._call.cancel()
            self._task.cancel()
            done, _ = await asyncio.wait({self._task}, timeout=STOP_TIMEOUT)
            if not done:
                log.warning("lease %x: the keepalive task did not stop", self.id)
        if not self.lost.is_set():
            await self.revoke()
