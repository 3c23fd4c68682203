"""SHA-1 sums taken on a worker thread, in order, while the event loop goes on.

An append is hashed twice: into its spool's running SHA-1 (the fragment's name) and on
its own (the SHA-1 its commit returns). Hashing costs more than anything else a broker
does per appended byte. `hashlib` releases the GIL while it hashes a large buffer, so one
of the two sums runs on a worker thread, on another core, while the loop writes the
spool and takes the other.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from concurrent.futures import Executor

#: Chunks smaller than this are summed on the loop (when nothing waits before them):
#: the hand-off to a thread would cost more than the hashing.
INLINE_BYTES = 32 << 10


class ThreadedSha1:
    """A SHA-1 of chunks summed on `executor`, which must run its work in submission
    order (one thread). At most `depth` chunks wait to be summed: a writer faster than
    the thread waits, rather than buffering an append in memory."""

    def __init__(self, executor: Executor | None, depth: int = 2) -> None:
        self._sha1 = hashlib.sha1()
        self._executor, self._depth = executor, depth
        self._pending: deque[asyncio.Future[None]] = deque()

    async def update(self, chunk: bytes | memoryview) -> None:
        """Sum `chunk` after the chunks before it. The caller keeps `chunk` unchanged
        until `digest()` returns."""
        if self._executor is None or (len(chunk) < INLINE_BYTES and not self._pending):
            self._sha1.update(chunk)
            return
        while len(self._pending) >= self._depth:
            await self._pending.popleft()
        loop = asyncio.get_running_loop()
        self._pending.append(loop.run_in_executor(self._executor, self._sha1.update, chunk))

    async def digest(self) -> bytes:
        """The SHA-1 of every chunk, once all are summed."""
        while self._pending:
            await self._pending.popleft()
        return self._sha1.digest()
