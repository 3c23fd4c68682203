"""`AppendQueue`: many small appends, few large Append RPCs.

It implements the message library's `AppendClient`: `append` queues synchronously and
returns a future. Per journal, one Append RPC is in flight at a time; appends queued
meanwhile go together in the next one (up to `max_batch_bytes`, an append larger than
that alone), so each append stays whole and contiguous, appends commit in call order,
and a busy journal sends few large RPCs rather than many small ones (each RPC and each
message costs far more than its bytes); on a data path (`gazette.client.framed`), up to
`PIPELINED` batches are in flight at once, each chained to the one before it, so they
still commit in call order. Every future of a batch resolves with that RPC's
`AppendResult` (its commit spans the whole batch) or fails with its error; a failed
batch does not stop the ones after it.

A batch is retried as `JournalClient.append` retries (without an expected offset, so a
lost answer to its commit fails its futures with `AppendUncertain`). With ``resend``, a
batch whose outcome is unknown, or that the brokers kept refusing as unavailable, is
sent again (the same bytes, before anything queued after it) until it commits: for
appends of messages, whose readers drop a repeat (a consumer's publishes and ACKs).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING

from gazette import names
from gazette.client.appends import ChainBroken
from gazette.client.errors import AppendUncertain, BrokerError, Unavailable
from gazette.client.framed import FramedConnection
from gazette.client.journal import JournalClient
from gazette.client.metrics import APPEND_RPCS
from gazette.client.results import AppendResult
from gazette.errors import GazetteError, ValidationError

log = logging.getLogger(__name__)

#: Batches of a journal in flight at once on its data path (one by gRPC).
PIPELINED = 4
#: Seconds before a batch is sent again (`AppendQueue` with ``resend``), doubling to the max.
RESEND_DELAY, MAX_RESEND_DELAY = 0.2, 5.0


class QueueClosed(GazetteError):
    """An append to an `AppendQueue` that was closed."""


class _Entry:
    __slots__ = ("data", "fut", "seq")

    def __init__(self, seq: int, data: bytes, fut: asyncio.Future[AppendResult]) -> None:
        self.seq, self.data, self.fut = seq, data, fut


class AppendQueue:
    """Batches appends per journal through `client`. `wait_for_room` is the
    backpressure: it waits while more than `max_pending_bytes` are queued or in flight.
    Use from one event loop; `close` (or ``async with``) flushes and stops its tasks."""

    def __init__(self, client: JournalClient, *, max_batch_bytes: int = 4 << 20,
                 max_pending_bytes: int = 64 << 20, resend: bool = False) -> None:
        for field, value in (("max_batch_bytes", max_batch_bytes),
                             ("max_pending_bytes", max_pending_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValidationError(field, f"expected an int >= 1, got {value!r}")
        self.client = client
        self.max_batch_bytes = max_batch_bytes
        self.max_pending_bytes = max_pending_bytes
        self.resend = resend
        self._queues: dict[str, deque[_Entry]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._inflight: dict[str, int] = {}  # journal -> seq of its batch's first append
        self._known: set[str] = set()  # journal names validated already
        self._seq = 0
        self._pending = 0
        self._room = asyncio.Event()
        self._room.set()
        self._progress = asyncio.Event()  # set (and replaced) whenever a batch resolves
        self._closed = False

    @property
    def pending_bytes(self) -> int:
        """Bytes queued or in flight."""
        return self._pending

    def append(self, journal: str, data: bytes) -> asyncio.Future[AppendResult]:
        """Queue `data` for `journal` (synchronously: call order is byte order) and
        return a future of its commit. Cancelling the future does not unqueue it."""
        if self._closed:
            raise QueueClosed(f"append to {journal}: the AppendQueue is closed")
        if journal not in self._known:
            names.validate_journal_name(journal, "journal")
            self._known.add(journal)
        if not isinstance(data, bytes):
            raise ValidationError("data", f"append to {journal}: expected bytes, got "
                                  f"{type(data).__name__}")
        fut: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        self._seq += 1
        queue = self._queues.get(journal)
        if queue is None:
            queue = self._queues[journal] = deque()
        queue.append(_Entry(self._seq, data, fut))
        self._pending += len(data)
        if self._pending > self.max_pending_bytes:
            self._room.clear()
        if journal not in self._tasks:
            self._tasks[journal] = asyncio.create_task(self._drain(journal, queue),
                                                       name=f"append-queue:{journal}")
        return fut

    async def wait_for_room(self) -> None:
        """Wait while more than `max_pending_bytes` are pending."""
        while self._pending > self.max_pending_bytes:
            await self._room.wait()

    async def _drain(self, journal: str, queue: deque[_Entry]) -> None:
        """Send `journal`'s queue, a batch at a time, until it is empty; on a data path
        (and without ``resend``), up to `PIPELINED` batches at once, each chained to the
        one before it (it commits only if that one did; if not, it is sent again after
        it), so that batches still commit in order."""
        inflight: deque[tuple[list[_Entry], asyncio.Future[AppendResult]]] = deque()
        on: FramedConnection | None = None  # (the data path what is in flight took)
        try:
            while queue or inflight:
                conn = None if self.resend else self.client.data_path(journal)
                while queue and (not inflight or (conn is not None and conn is on
                                                  and len(inflight) < PIPELINED)):
                    batch = self._batch(queue)
                    inflight.append((batch, asyncio.ensure_future(
                        self._send_batch(journal, batch, conn, chained=bool(inflight)))))
                    on = conn
                batch, sent = inflight[0]  # (in `inflight` until resolved: see finally)
                self._inflight[journal] = batch[0].seq
                try:
                    result = await sent
                except ChainBroken:
                    # It, and every chained one after it, was not appended: again, in order.
                    await asyncio.gather(*(f for _, f in inflight), return_exceptions=True)
                    for entries, _ in reversed(inflight):
                        queue.extendleft(reversed(entries))
                    inflight.clear()
                    continue
                except Exception as err:  # noqa: BLE001 - handed to every waiter
                    log.debug("append of %d queued appends to %s failed: %s", len(batch),
                              journal, err)
                    for entry in batch:
                        if not entry.fut.done():
                            entry.fut.set_exception(err)
                else:
                    for entry in batch:
                        if not entry.fut.done():
                            entry.fut.set_result(result)
                inflight.popleft()
                self._resolved(journal, batch)
        finally:
            # Cancelled (close) or broken: fail what can no longer be sent.
            for _, sent in inflight:
                sent.cancel()
            self._give_up(journal, [e for b, _ in inflight for e in b])

    def _batch(self, queue: deque[_Entry]) -> list[_Entry]:
        batch = [queue.popleft()]
        size = len(batch[0].data)
        while queue and size + len(queue[0].data) <= self.max_batch_bytes:
            batch.append(queue.popleft())
            size += len(batch[-1].data)
        return batch

    async def _send_batch(self, journal: str, batch: list[_Entry],
                          conn: FramedConnection | None, *, chained: bool) -> AppendResult:
        """A batch on `conn` (chained, or not), else as `JournalClient.append` sends it.
        Refused on `conn`, it is sent again that way: nothing was written, what is
        chained after it will not be, and what it was chained to committed."""
        APPEND_RPCS.inc()
        content = [e.data for e in batch]
        if conn is not None:
            try:
                return await self.client.append_chained(conn, journal, content,
                                                        chained=chained)
            except (ChainBroken, AppendUncertain):
                raise
            except (BrokerError, ValidationError) as err:  # refused: nothing written
                log.debug("append to %s on its data path refused (%s): sending it again",
                          journal, err)
        return await self._send(journal, content)

    def _give_up(self, journal: str, batch: list[_Entry] | None = None) -> None:
        """Cancel `journal`'s unsent appends (and its batch in flight), and forget it."""
        queue = self._queues.pop(journal, deque())
        rest = [*(batch or ()), *queue]
        queue.clear()
        for entry in rest:
            entry.fut.cancel()
        self._resolved(journal, rest)
        self._tasks.pop(journal, None)

    async def _send(self, journal: str, content: list[bytes]) -> AppendResult:
        delay = RESEND_DELAY
        while True:
            try:
                return await self.client.append(journal, content)
            except (AppendUncertain, Unavailable, BrokerError) as err:
                if not self.resend or (isinstance(err, BrokerError)
                                       and not err.route_changing):
                    raise
                log.warning("append to %s: %s; sending it again in %.1fs", journal, err,
                            delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_RESEND_DELAY)

    def _resolved(self, journal: str, batch: list[_Entry]) -> None:
        self._inflight.pop(journal, None)
        self._pending -= sum(len(e.data) for e in batch)
        if self._pending <= self.max_pending_bytes:
            self._room.set()
        self._progress.set()
        self._progress = asyncio.Event()

    def _oldest_unresolved(self) -> int | None:
        oldest: int | None = None
        for journal, queue in self._queues.items():
            seq = self._inflight.get(journal, queue[0].seq if queue else None)
            if seq is not None and (oldest is None or seq < oldest):
                oldest = seq
        return oldest

    async def flush(self) -> None:
        """Wait until every append queued so far has resolved (committed or failed)."""
        upto = self._seq
        while True:
            oldest = self._oldest_unresolved()
            if oldest is None or oldest > upto:
                return
            await self._progress.wait()

    async def close(self, *, flush: bool = True) -> None:
        """Refuse further appends, flush (unless not `flush`: a caller that failed
        gives up on what is unresolved, whose futures are cancelled, rather than wait
        on a resend that may never commit), then stop the tasks."""
        self._closed = True
        try:
            if flush:
                await self.flush()
        finally:
            tasks = list(self._tasks.values())
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # A task cancelled before it ran never reached its cleanup: do it here.
            for journal in list(self._queues):
                self._give_up(journal)

    async def __aenter__(self) -> AppendQueue:
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        await self.close(flush=exc_type is None)


if TYPE_CHECKING:  # it is the Publisher's AppendClient
    from gazette.message.publisher import AppendClient

    def _conforms(queue: AppendQueue) -> AppendClient:
        return queue
