"""A shard assigned to this member: run as primary, or wait as a standby.

`LocalShard` is the cluster layer's local object of a `ShardSpec` (`gazette.cluster.
LocalItems` opens, updates and closes it). While this member is the shard's primary (and
the spec is not disabled) it runs a `ShardRunner`, and announces the route it serves
under (what the allocator's consistency check reads before it moves the shard away).
When the route names another primary, or the spec changes, the runner stops (a changed
spec starts a new one). A runner that fails marks the shard FAILED with the error, and
the member goes on serving its other shards; the shard runs again when its spec changes
or it is assigned anew. Every change of `status` is reported (the member writes it into
etcd, where List, gazctl and the operator read it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter

from gazette.cluster import Resolution
from gazette.consumer.runner import ShardRunner
from gazette.protocol import ProcessId, ReplicaState, ReplicaStatus, ShardSpec
from gazette.supervise import cancel_and_wait

log = logging.getLogger(__name__)

SHARD_FAILURES = Counter("gazette_consumer_shard_failures_total",
                         "Shard runs that failed (the shard is marked FAILED)")

#: How long a stopping runner may take (its store's rollback and close) before the
#: shard lets go of it, logging where it is stuck: a member's shutdown never hangs.
RUNNER_STOP_SECONDS = 15.0

PENDING, RECOVERING, STANDBY, PRIMARY, FAILED = (
    ReplicaState.PENDING, ReplicaState.RECOVERING, ReplicaState.STANDBY, ReplicaState.PRIMARY,
    ReplicaState.FAILED)


class LocalShard:
    """`spec` on member `me`: `new_runner(spec)` makes its runner; `announce(id, route)`
    writes a route the primary serves under into the shard's assignments;
    `report(id, status)` is told every status (None: the shard left this member)."""

    def __init__(self, spec: ShardSpec, me: ProcessId,
                 new_runner: Callable[[ShardSpec], ShardRunner],
                 announce: Callable[[str, Any], Any],
                 report: Callable[[str, ReplicaStatus | None], None]) -> None:
        self.spec, self.me = spec, me
        self._new_runner, self._announce, self._report = new_runner, announce, report
        self.route: Resolution[ShardSpec] | None = None
        self.runner: ShardRunner | None = None
        self._status = ReplicaStatus(PENDING)
        report(self.id, self._status)
        self._task: asyncio.Task[None] | None = None
        self._failed_spec: ShardSpec | None = None
        self._changed = asyncio.Event()

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def status(self) -> ReplicaStatus:
        return self._status

    @status.setter
    def status(self, status: ReplicaStatus) -> None:
        if status != self._status:
            self._status = status
            self._report(self.id, status)

    @property
    def is_primary(self) -> bool:
        return self.route is not None and self.route.route.primary_id == self.me

    def update_spec(self, spec: ShardSpec) -> None:
        if spec != self.spec:
            self.spec = spec
            self._changed.set()

    def update_route(self, res: Resolution[Any]) -> None:
        self.route = res
        self._changed.set()

    async def run(self) -> None:
        """Until cancelled: start, stop or restart the runner as the route and spec
        say; announce the routes it runs under."""
        announced = None
        try:
            while True:
                self._changed.clear()
                await self._converge()
                route = self.route
                # (False: the assignments moved on; a newer route comes, update_route)
                if self.is_primary and route is not None and route.route != announced \
                        and not route.announced and await self._announce(self.id,
                                                                           route.route):
                    announced = route.route
                waits = [asyncio.ensure_future(self._changed.wait())]
                if self._task is not None:
                    waits.append(self._task)  # type: ignore[arg-type]
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waits[0].cancel()
        finally:
            await self._stop_runner()

    async def _converge(self) -> None:
        task = self._task
        if task is not None and task.done():
            self._task = None
            if not task.cancelled() and task.exception() is not None:
                err = task.exception()
                SHARD_FAILURES.inc()
                self.status = ReplicaStatus(FAILED, f"{type(err).__name__}: {err}")
                self._failed_spec = self.spec
                log.error("shard %s failed: %s", self.id, self.status.error)
        wanted = self.is_primary and not self.spec.disable and \
            self._failed_spec != self.spec
        running = self.runner is not None and self.runner.spec
        if running and (not wanted or running != self.spec):
            await self._stop_runner()
        if wanted and self._task is None:
            runner = self.runner = self._new_runner(self.spec)
            runner.on_restored = lambda: self._restored(runner)
            self._task = asyncio.create_task(runner.run(), name=f"shard:{self.id}")
            self.status = ReplicaStatus(RECOVERING)
            self._failed_spec = None
            log.info("shard %s: running as primary", self.id)
        elif not wanted and self.status.state != FAILED:
            self.status = ReplicaStatus(STANDBY if self.route is not None else PENDING)

    def _restored(self, runner: ShardRunner) -> None:
        if runner is self.runner:
            self.status = ReplicaStatus(PRIMARY)

    async def _stop_runner(self) -> None:
        task, self._task, self.runner = self._task, None, None
        if task is not None and not task.done():
            await cancel_and_wait(task, RUNNER_STOP_SECONDS)

    async def close(self, reason: str) -> None:
        await self._stop_runner()
        self._report(self.id, None)
        log.info("shard %s: stopped here (%s)", self.id, reason)
