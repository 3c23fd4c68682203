"""`AppendQueue`: many small appends, few large Append RPCs.

It implements the message library's `AppendClient`: `append` queues synchronously and
returns a future. Per journal, one Append RPC is in flight at a time; appends queued
meanwhile go together in the next one (up to `max_batch_bytes`), so each append stays
whole and contiguous, appends commit in call order, and a busy journal sends few large
RPCs rather than many small ones. Every future of a batch resolves with that RPC's
`AppendResult` (its commit spans the whole batch) or fails with its error.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from gazette.client.journal import AppendResult, JournalClient


class AppendQueue:
    """Batches appends per journal through `client`; `wait_for_room` is the
    backpressure: it waits while more than `max_pending_bytes` are queued."""

    def __init__(self, client: JournalClient, *, max_batch_bytes: int = 4 << 20,
                 max_pending_bytes: int = 64 << 20) -> None:
        self.client = client
        self.max_batch_bytes = max_batch_bytes
        self.max_pending_bytes = max_pending_bytes
        self._queues: dict[str, deque[tuple[bytes, asyncio.Future[AppendResult]]]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._pending = 0
        self._room = asyncio.Event()
        self._room.set()
        self._closed = False

    @property
    def pending_bytes(self) -> int:
        return self._pending

    def append(self, journal: str, data: bytes) -> asyncio.Future[AppendResult]:
        if self._closed:
            raise RuntimeError("append to a closed AppendQueue")
        fut: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(journal, deque()).append((data, fut))
        self._pending += len(data)
        if self._pending > self.max_pending_bytes:
            self._room.clear()
        if journal not in self._tasks:
            self._tasks[journal] = asyncio.create_task(self._drain(journal),
                                                       name=f"append-queue:{journal}")
        return fut

    async def wait_for_room(self) -> None:
        await self._room.wait()

    async def _drain(self, journal: str) -> None:
        queue = self._queues[journal]
        try:
            while queue:
                batch = [queue.popleft()]
                size = len(batch[0][0])
                while queue and size + len(queue[0][0]) <= self.max_batch_bytes:
                    batch.append(queue.popleft())
                    size += len(batch[-1][0])
                try:
                    result = await self.client.append(journal, [d for d, _ in batch])
                except Exception as err:  # noqa: BLE001 - handed to every waiter
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(err)
                else:
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_result(result)
                self._pending -= size
                if self._pending <= self.max_pending_bytes:
                    self._room.set()
        finally:
            del self._tasks[journal]
            if not queue:
                del self._queues[journal]

    async def flush(self) -> None:
        """Wait until everything queued so far is committed (or failed)."""
        while self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def close(self) -> None:
        """Flush, then refuse further appends."""
        self._closed = True
        try:
            await self.flush()
        finally:
            for task in self._tasks.values():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*self._tasks.values(), return_exceptions=True)
