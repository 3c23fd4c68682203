"""`IdleWatch`: cancel a task that stops making progress.

A stalled client must not hold what it holds for ever (an append stream holds its
journal's lock). One timer per interval, not one per chunk: touching is a counter
increment on the hot path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType


class IdleWatch:
    """Cancels the task using it when `touch()` was not called for `timeout` seconds,
    and raises `error(timeout)` in its place."""

    def __init__(self, timeout: float, error: Callable[[float], BaseException]) -> None:
        """`error(timeout)`: what is raised in the task's place."""
        self.timeout, self._error = timeout, error
        self._count = self._seen = 0
        self._fired = False
        self._task: asyncio.Task[object] | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._cancelling = 0

    def touch(self) -> None:
        self._count += 1

    async def __aenter__(self) -> IdleWatch:
        self._task = asyncio.current_task()
        assert self._task is not None
        self._cancelling = self._task.cancelling()
        self._schedule()
        return self

    def _schedule(self) -> None:
        self._handle = asyncio.get_running_loop().call_later(self.timeout, self._check)

    def _check(self) -> None:
        if self._count != self._seen:
            self._seen = self._count
            self._schedule()
            return
        self._fired = True
        assert self._task is not None
        self._task.cancel()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._handle is not None:
            self._handle.cancel()
        assert self._task is not None
        if self._fired and exc_type is asyncio.CancelledError and \
                self._task.uncancel() <= self._cancelling:
            raise self._error(self.timeout) from exc
