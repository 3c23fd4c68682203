"""Supervised tasks: every long-lived task of a process is owned, restarted when it fails
for a reason that passes, and fatal to the process when it fails for one that does not.

A task that ends with a *transient* error (etcd or a store unreachable, an I/O error) is
started again after a jittered, growing delay, and each restart is counted in
``gazette_task_restarts_total``; a run that lasted `HEALTHY_SECONDS` before it failed
starts the delay afresh (a task that ran well for an hour and then meets a blip is
restarted at once, not after the longest delay its last outage reached). Any other
error is a bug or a state the process cannot leave by itself: the supervisor records it
as `failure`, sets `failed`, and the process owner stops with a non-zero exit (so
Kubernetes restarts it), instead of serving half-alive with a task silently gone. A
task that returns normally is done.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import Counter

from gazette.errors import GazetteError

log = logging.getLogger(__name__)

TASK_RESTARTS = Counter("gazette_task_restarts_total",
                        "Supervised tasks restarted after a transient error", ["task"])
TASK_FAILURES = Counter("gazette_task_failures_total",
                        "Supervised tasks that failed for a reason they cannot survive "
                        "(the process stops)", ["task"])

RESTART_INITIAL, RESTART_MAX = 0.2, 10.0
#: A run this long before it failed was healthy: the next restart waits `RESTART_INITIAL`.
HEALTHY_SECONDS = 10.0


def retrieved(fut: asyncio.Future[Any]) -> None:
    """A done callback for a future whose failure is reported elsewhere (or not at
    all: it is one of many that fail alike): it is marked retrieved, so asyncio does
    not log it as never retrieved."""
    if not fut.cancelled():
        fut.exception()


def settle(fut: asyncio.Future[Any], done: asyncio.Future[Any]) -> None:
    """Resolve `fut` as `done` was (a done-callback of `done`, with `fut` bound: a
    future that follows another without a task); nothing if `fut` is done already."""
    if fut.done():
        return
    if done.cancelled():
        fut.cancel()
    elif (err := done.exception()) is not None:
        fut.set_exception(err)
    else:
        fut.set_result(done.result())


def await_chain(task: asyncio.Future[Any]) -> str:
    """Where a task waits: each coroutine it awaits, innermost last (a task's own stack
    shows only its outermost frame)."""
    lines = []
    coro: Any = task.get_coro() if isinstance(task, asyncio.Task) else None
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None) \
            or getattr(coro, "gi_frame", None)
        if frame is not None:
            lines.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} "
                         f"{frame.f_code.co_name}")
        nxt = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None) \
            or getattr(coro, "gi_yieldfrom", None)
        if nxt is None and type(coro).__name__.endswith("async_generator_asend"):
            # An `async for` step: the generator it steps is only reachable this way.
            nxt = next((r for r in gc.get_referents(coro) if hasattr(r, "ag_frame")), None)
        if nxt is None:
            lines.append(f"  on {coro!r}"[:300])
        coro = nxt
    return "\n".join(lines)


async def cancel_and_wait(task: asyncio.Future[Any], timeout: float | None = None) -> None:
    """Cancel `task` and wait until it has finished, whatever it ends with; but if the
    caller itself is cancelled meanwhile, that cancellation goes on (swallowing it would
    leave whoever cancels the caller waiting forever). With `timeout`, a task still
    running after that many seconds is left behind, logged with where it is stuck, so
    that a shutdown never hangs on it."""
    task.cancel()
    if timeout is not None:
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            log.error("%r did not finish %.0f s after its cancellation: left behind, "
                      "awaiting:\n%s", task, timeout, await_chain(task))
            return
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
    except Exception:
        log.debug("a cancelled task failed while finishing", exc_info=True)


class TaskFailed(GazetteError):
    """A supervised task failed for a reason it cannot survive."""

    def __init__(self, name: str, error: BaseException) -> None:
        self.name, self.error = name, error
        super().__init__(f"task {name} failed: {type(error).__name__}: {error}")


Factory = Callable[[], Awaitable[None]]


class Supervisor:
    """Runs named tasks until `close()`. `transient` are the error types a task is
    restarted after (others are fatal); `kind` of a task labels its metrics (names may
    be many, e.g. one per journal)."""

    def __init__(self, transient: tuple[type[BaseException], ...] = (OSError,)) -> None:
        self.transient = transient
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.failed = asyncio.Event()
        self.failure: TaskFailed | None = None
        self._closed = False

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, name: str, factory: Factory, *, kind: str = "",
              transient: tuple[type[BaseException], ...] | None = None) -> None:
        """Run `factory()` as task `name` (replacing none: the name must be free)."""
        if self._closed:
            raise RuntimeError("the supervisor is closed")
        if name in self._tasks:
            raise ValueError(f"task {name} is already running")
        # Exported at 0 from the start: an alert on their increase sees the first one.
        TASK_RESTARTS.labels(kind or name)
        TASK_FAILURES.labels(kind or name)
        self._tasks[name] = asyncio.create_task(
            self._run(name, kind or name, factory, transient or self.transient), name=name)

    async def _run(self, name: str, kind: str, factory: Factory,
                   transient: tuple[type[BaseException], ...]) -> None:
        loop = asyncio.get_running_loop()
        delay = RESTART_INITIAL
        try:
            while True:
                started = loop.time()
                try:
                    await factory()
                    return
                except transient as err:
                    TASK_RESTARTS.labels(kind).inc()
                    if loop.time() - started >= HEALTHY_SECONDS:
                        delay = RESTART_INITIAL  # it ran well: this is a new outage
                    wait = delay * random.uniform(0.5, 1.5)
                    log.warning("%s failed (%s: %s); restarting it in %.1fs", name,
                                type(err).__name__, err, wait)
                    await asyncio.sleep(wait)
                    delay = min(delay * 2, RESTART_MAX)
        except asyncio.CancelledError:
            raise
        except BaseException as err:  # anything else is fatal, loudly
            TASK_FAILURES.labels(kind).inc()
            log.critical("%s failed and cannot recover: the process stops", name,
                         exc_info=err)
            if self.failure is None:
                self.failure = TaskFailed(name, err)
            self.failed.set()
        finally:
            if self._tasks.get(name) is asyncio.current_task():
                del self._tasks[name]

    async def wait_failed(self) -> None:
        """Return never while tasks are healthy; raise `TaskFailed` once one failed."""
        await self.failed.wait()
        assert self.failure is not None
        raise self.failure

    async def stop(self, name: str) -> None:
        """Cancel task `name` (if running) and wait until it has finished."""
        task = self._tasks.pop(name, None)
        if task is not None:
            await cancel_and_wait(task)

    async def close(self) -> None:
        """Cancel every task and wait until all have finished."""
        self._closed = True
        tasks, self._tasks = list(self._tasks.values()), {}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
