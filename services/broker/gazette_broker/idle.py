"""`IdleWatch`: cancel a task that stops making progress.

A stalled client must not hold what it holds for ever (an append stream holds its
journal's lock). Watches cost their task a set insertion and a counter per chunk: one
sweep, a few times a second while any watch is active, checks them all (no timer per
append: appends run thousands a second).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from types import TracebackType

#: How often active watches are checked (a stall is noticed at most this late).
SWEEP_SECONDS = 0.25


class IdleWatch:
    """Cancels the task using it when `touch()` was not called for `timeout` seconds,
    and raises `error(timeout)` in its place."""

    def __init__(self, timeout: float, error: Callable[[float], BaseException]) -> None:
        """`error(timeout)`: what is raised in the task's place."""
        self.timeout, self._error = timeout, error
        self.count = self._seen = 0
        self._since = 0.0
        self._fired = False
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0

    def touch(self) -> None:
        self.count += 1

    async def __aenter__(self) -> IdleWatch:
        self._task = asyncio.current_task()
        assert self._task is not None
        self._cancelling = self._task.cancelling()
        loop = asyncio.get_running_loop()
        self._since = loop.time()
        _Sweep.of(loop).add(self)
        return self

    def check(self, now: float) -> None:
        """Called by the sweep: cancel the task if nothing happened for `timeout`."""
        if self.count != self._seen:
            self._seen, self._since = self.count, now
        elif now - self._since >= self.timeout and not self._fired:
            self._fired = True
            assert self._task is not None
            self._task.cancel()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        _Sweep.of(asyncio.get_running_loop()).discard(self)
        assert self._task is not None
        if self._fired and exc_type is asyncio.CancelledError and \
                self._task.uncancel() <= self._cancelling:
            raise self._error(self.timeout) from exc


class _Sweep:
    """The active watches of one event loop, checked every `SWEEP_SECONDS`."""

    _loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Sweep] = \
        weakref.WeakKeyDictionary()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.watches: set[IdleWatch] = set()
        self.handle: asyncio.TimerHandle | None = None

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> _Sweep:
        sweep = cls._loops.get(loop)
        if sweep is None:
            sweep = cls._loops[loop] = cls(loop)
        return sweep

    def add(self, watch: IdleWatch) -> None:
        self.watches.add(watch)
        if self.handle is None:
            self.handle = self.loop.call_later(SWEEP_SECONDS, self.run)

    def discard(self, watch: IdleWatch) -> None:
        self.watches.discard(watch)

    def run(self) -> None:
        now = self.loop.time()
        for watch in list(self.watches):
            watch.check(now)
        self.handle = self.loop.call_later(SWEEP_SECONDS, self.run) if self.watches \
            else None
