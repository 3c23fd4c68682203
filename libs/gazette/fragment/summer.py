"""SHA-1 sums taken on a worker thread, in order, while the event loop goes on (and an
append's spool writes, on a thread of their own).

An append is hashed twice: into its spool's running SHA-1 (the fragment's name) and on
its own (the SHA-1 its commit returns). Hashing costs more than anything else a broker
does per appended byte. `hashlib` releases the GIL while it hashes a large buffer, so
both sums run on a worker thread, on another core, while the loop receives content;
`os.pwrite` releases it too, so a broker's spool writes of large chunks run on a second
thread (where the page cache is slow, writes on the loop starved the reads it serves).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Protocol


class Hash(Protocol):
    def update(self, data: bytes | memoryview, /) -> None: ...


#: Chunks smaller than this are summed on the loop (when nothing waits before them):
#: the hand-off to a thread would cost more than the hashing.
INLINE_BYTES = 32 << 10


class ThreadedSha1:
    """A SHA-1 of chunks summed on `executor`, which must run its work in submission
    order (one thread); each chunk is also summed into the hashes of `also` (a spool's
    running SHA-1), so that the loop hashes nothing. At most `depth` chunks wait to be
    summed: a writer faster than the thread waits, rather than buffering an append in
    memory. Without an executor, everything is summed on the loop."""

    def __init__(self, executor: Executor | None, depth: int = 2,
                 also: Sequence[Hash] = (), own: bool = True,
                 write: Callable[[bytes | memoryview], None] | None = None,
                 writer: Executor | None = None) -> None:
        """`own`: whether to keep a SHA-1 of the chunks themselves (a replica peer sums
        only into its spool's). `write`: called with each chunk, in order, on `writer`'s
        thread (one thread; a spool's write: a slow page cache then stalls that thread,
        not the loop that serves reads) while `executor` sums it; on the loop for the
        small chunks summed there."""
        self._sha1 = hashlib.sha1()
        self._hashes = (self._sha1, *also) if own else tuple(also)
        self._executor, self._depth = executor, depth
        self._write, self._writer = write, writer
        self._pending: deque[asyncio.Future[None]] = deque()

    def _sum(self, chunk: bytes | memoryview) -> None:
        for h in self._hashes:
            h.update(chunk)

    async def settle(self) -> None:
        """Wait until the thread is done with every chunk given (failed or not): then
        nothing more is written or summed."""
        while self._pending:
            with contextlib.suppress(Exception):
                await self._pending.popleft()

    async def update(self, chunk: bytes | memoryview) -> None:
        """Sum `chunk` after the chunks before it. The caller keeps `chunk` unchanged
        until `digest()` returns."""
        if self._executor is None or (len(chunk) < INLINE_BYTES and not self._pending):
            if self._write is not None:
                self._write(chunk)
            self._sum(chunk)
            return
        while len(self._pending) >= self._depth:
            await self._pending.popleft()
        loop = asyncio.get_running_loop()
        if self._write is not None:
            if self._writer is None:
                self._write(chunk)
            else:
                self._pending.append(loop.run_in_executor(self._writer, self._write, chunk))
        self._pending.append(loop.run_in_executor(self._executor, self._sum, chunk))

    async def digest(self) -> bytes:
        """The SHA-1 of every chunk, once all are summed (into `also` too)."""
        while self._pending:
            await self._pending.popleft()
        return self._sha1.digest()
