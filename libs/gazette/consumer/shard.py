"""A shard assigned to this member: run as primary, or wait as a standby.

`LocalShard` is the cluster layer's local object of a `ShardSpec` (`gazette.cluster.
LocalItems` opens, updates and closes it). While this member is the shard's primary (and
the spec is not disabled) it runs a `ShardRunner`, and announces the route it serves
under; its status (STANDBY once caught up, PRIMARY once restored) is what the
allocator's consistency check reads before it moves the shard away.
When the route names another primary, or the spec changes, the runner stops (a changed
spec starts a new one). A runner that fails marks the shard FAILED with the error, and
the member goes on serving its other shards; the shard runs again when its spec or its
role (primary, standby) changes, or it is assigned anew. A transient failure (brokers or
etcd out of reach, a broker refusal that wrote nothing and says to retry: a route that
is changing, too few brokers, a store that does not take fragments yet) is not final:
the shard shows RECOVERING with the error and runs again after a backoff, however long
the fault lasts. While its member's lease may have run out (etcd does not answer) a
primary does not run; it runs again once etcd has refreshed the lease. Every change of
`status` is reported (the member writes it into etcd, where List, gazctl and the
operator read it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import Counter, Gauge

from gazette.allocator import Route
from gazette.cluster import Resolution
from gazette.consumer.recovery import Standby
from gazette.consumer.runner import ShardRunner
from gazette.errors import GazetteError
from gazette.protocol import ProcessId, ReplicaState, ReplicaStatus, ShardSpec
from gazette.recoverylog import Player
from gazette.recoverylog import Progress as PlayProgress
from gazette.supervise import cancel_and_wait

log = logging.getLogger(__name__)

SHARD_FAILURES = Counter("gazette_consumer_shard_failures_total",
                         "Shard runs that failed (the shard is marked FAILED)")
SHARD_RESTARTS = Counter("gazette_consumer_shard_restarts_total",
                         "Shard runs ended by a transient fault (brokers or etcd out of "
                         "reach) and run again after a backoff")
SHARD_STATUS = Gauge("gazette_consumer_shard_status",
                     "1 for the status this member's replica of a shard is in, else 0",
                     ["shard", "status"])
RECOVERY_BEHIND = Gauge("gazette_consumer_recovery_behind_bytes",
                        "Bytes of its recovery log a RECOVERING replica has still to play "
                        "(0 once it plays from the log's head)", ["shard"])

#: A shard whose run failed for a fault that passes (`transient`) runs again after
#: `RESTART_FIRST_SECONDS`, doubling up to `RESTART_MAX_SECONDS` while they repeat.
RESTART_FIRST_SECONDS = 0.5
RESTART_MAX_SECONDS = 30.0

#: How long a stopping runner may take (its store's rollback and close) before the
#: shard lets go of it, logging where it is stuck: a member's shutdown never hangs.
RUNNER_STOP_SECONDS = 15.0

PENDING, RECOVERING, STANDBY, PRIMARY, FAILED = (
    ReplicaState.PENDING, ReplicaState.RECOVERING, ReplicaState.STANDBY, ReplicaState.PRIMARY,
    ReplicaState.FAILED)


def transient(err: BaseException) -> bool:
    """Whether a run that failed with `err` (or with what caused it) failed for a fault
    that passes (the error is `retriable`: brokers or etcd out of reach, an append in
    doubt, a journal's route changing or its store not taking fragments yet): the shard
    runs again rather than stays FAILED."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, GazetteError) and seen.retriable:
            return True
        seen = seen.__cause__
    return False


class LocalShard:
    """`spec` on member `me`: `new_runner(spec)` makes its runner; `announce(id, route)`
    writes a route the primary serves under into the shard's assignments;
    `report(id, status)` is told every status (None: the shard left this member);
    `live()` says whether the member may act on its assignments (`update_live` when it
    changes)."""

    def __init__(self, spec: ShardSpec, me: ProcessId,
                 new_runner: Callable[[ShardSpec], ShardRunner],
                 announce: Callable[[str, Route], Awaitable[bool]],
                 report: Callable[[str, ReplicaStatus | None], None],
                 new_standby: Callable[[ShardSpec], Standby] | None = None,
                 live: Callable[[], bool] = lambda: True) -> None:
        self.spec, self.me = spec, me
        self._live = live
        self._new_runner, self._announce, self._report = new_runner, announce, report
        self._new_standby = new_standby
        self.standby: Standby | None = None
        self._standby_task: asyncio.Task[None] | None = None
        self._progress_at = 0.0
        self.route: Resolution[ShardSpec] | None = None
        self.runner: ShardRunner | None = None
        self._status = ReplicaStatus(PENDING)
        self._tell(self._status)
        self._task: asyncio.Task[None] | None = None
        #: The spec and role (primary?) a run failed under: it is not tried again
        #: until either changes (a failed standby that is promoted tries as primary).
        self._failed_as: tuple[ShardSpec, bool] | None = None
        self._restarts = 0  # transient failures since the last run that restored
        #: Set after a transient failure: no run until it fires (`_release`).
        self._held: asyncio.TimerHandle | None = None
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
            self._tell(status)

    def _tell(self, status: ReplicaStatus | None) -> None:
        """`report` it, and export it as metrics (None: the shard left this member)."""
        self._report(self.id, status)
        export_status(self.id, status)

    @property
    def is_primary(self) -> bool:
        return self.route is not None and self.route.route.primary_id == self.me

    @property
    def primary_runner(self) -> ShardRunner | None:
        """Its runner while this member is its primary (queries are answered by it)."""
        return self.runner if self.is_primary else None

    def update_spec(self, spec: ShardSpec) -> None:
        if spec != self.spec:
            self.spec = spec
            self._changed.set()

    def update_route(self, res: Resolution[ShardSpec]) -> None:
        self.route = res
        self._changed.set()

    def update_live(self) -> None:
        """The member's `live()` changed: stop the runner, or run it again."""
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
                for task in (self._task, self._standby_task):
                    if task is not None:
                        waits.append(task)  # type: ignore[arg-type]
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waits[0].cancel()
        finally:
            if self._held is not None:
                self._held.cancel()
            await self._stop_runner()
            await self._drop_standby()

    def _failed(self, task: asyncio.Task[None] | None, what: str) -> bool:
        """Whether `task` is done (it is then forgotten); a failure marks the shard,
        unless it is transient (brokers or etcd out of reach): the shard then runs again
        after a backoff."""
        if task is None or not task.done():
            return False
        if not task.cancelled() and (err := task.exception()) is not None:
            if transient(err):
                self._restarts += 1
                delay = min(RESTART_FIRST_SECONDS * 2 ** (self._restarts - 1),
                            RESTART_MAX_SECONDS)
                SHARD_RESTARTS.inc()
                self.status = ReplicaStatus(RECOVERING, f"{what}{type(err).__name__}: {err} "
                                            f"(running again in {delay:.1f}s)")
                log.warning("shard %s: %s", self.id, self.status.error)
                if self._held is not None:
                    self._held.cancel()
                self._held = asyncio.get_running_loop().call_later(delay, self._release)
                return True
            SHARD_FAILURES.inc()
            # A note says where (the runner's: the journal and offset of the message).
            where = "; ".join(str(n) for n in getattr(err, "__notes__", ()))
            self.status = ReplicaStatus(FAILED, f"{what}{type(err).__name__}: {err}"
                                        + (f" ({where})" if where else ""))
            self._failed_as = (self.spec, self.is_primary)
            log.error("shard %s failed: %s", self.id, self.status.error, exc_info=err)
        return True

    async def _converge(self) -> None:
        if self._failed(self._task, ""):
            self._task = None
        if self._failed(self._standby_task, "as a hot standby: "):
            self._standby_task = None
        ok = not self.spec.disable and self._failed_as != (self.spec, self.is_primary) \
            and self._held is None
        live = self._live()
        wanted = self.is_primary and ok and live
        running = self.runner is not None and self.runner.spec
        if running and (not wanted or running != self.spec):
            await self._stop_runner()
        standby = self._new_standby is not None and self.route is not None and ok and \
            not self.is_primary and self.spec.recovery_log is not None
        if self.standby is not None and (not standby or self.standby.spec != self.spec) \
                and not wanted:
            await self._drop_standby()
        if wanted and self._task is None:
            runner = self.runner = self._new_runner(self.spec)
            runner.on_restored = lambda: self._restored(runner)
            runner.on_progress = self._progress
            runner.standby = await self._take_standby()
            self._task = asyncio.create_task(runner.run(), name=f"shard:{self.id}")
            self.status = ReplicaStatus(RECOVERING)
            self._failed_as = None
            log.info("shard %s: running as primary%s", self.id,
                     " (from its hot standby)" if runner.standby is not None else "")
        elif standby and self.standby is None and self._new_standby is not None:
            self.standby = self._new_standby(self.spec)
            self.standby.on_progress = self._progress
            self.standby.on_ready = self._standby_ready
            self._standby_task = asyncio.create_task(self.standby.run(),
                                                     name=f"standby:{self.id}")
            self.status = ReplicaStatus(RECOVERING)
            log.info("shard %s: a hot standby here", self.id)
        elif self.is_primary and ok and not live:
            self.status = ReplicaStatus(RECOVERING, "not running: this member's lease may "
                                        "have run out (etcd does not answer); it runs "
                                        "again once etcd refreshes the lease")
        elif not wanted and self.standby is None and self.status.state != FAILED and \
                self._held is None:
            self.status = ReplicaStatus(STANDBY if self.route is not None else PENDING)

    def _release(self) -> None:
        self._held = None
        self._changed.set()

    def _progress(self, progress: PlayProgress) -> None:
        """Playback progress into the status (at most twice a second)."""
        now = asyncio.get_running_loop().time()
        if self.status.state == RECOVERING and (now - self._progress_at >= 0.5 or
                                                progress.played >= progress.to_play):
            self._progress_at = now
            self.status = ReplicaStatus(RECOVERING, played=progress.played,
                                        to_play=progress.to_play)

    def _standby_ready(self) -> None:
        if self.status.state == RECOVERING and self.runner is None:
            self.status = ReplicaStatus(STANDBY)

    async def _take_standby(self) -> Player | None:
        """A hot standby here stops tailing; its player, if it had caught up (the
        primary hands off from it), else None (it is dropped)."""
        standby, task = self.standby, self._standby_task
        if standby is None or task is None:
            return None
        if standby.player is None or task.done():
            await self._drop_standby()
            return None
        standby.stop()
        try:
            await asyncio.wait_for(asyncio.shield(task), RUNNER_STOP_SECONDS)
        except Exception as err:  # noqa: BLE001 - a fresh recovery instead
            log.warning("shard %s: its hot standby stopped badly (%s): recovering "
                        "afresh", self.id, err)
            await self._drop_standby()
            return None
        self.standby = self._standby_task = None
        return standby.player

    async def _drop_standby(self) -> None:
        standby, task = self.standby, self._standby_task
        self.standby = self._standby_task = None
        if task is not None and not task.done():
            await cancel_and_wait(task, RUNNER_STOP_SECONDS)
        if standby is not None and (task is None or task.done()):
            await standby.discard()  # (one left behind discards itself when it ends)

    def _restored(self, runner: ShardRunner) -> None:
        if runner is self.runner:
            self._restarts = 0
            self.status = ReplicaStatus(PRIMARY)

    async def _stop_runner(self) -> None:
        task, self._task, self.runner = self._task, None, None
        if task is not None and not task.done():
            await cancel_and_wait(task, RUNNER_STOP_SECONDS)

    async def close(self, reason: str) -> None:
        if self._held is not None:
            self._held.cancel()
        await self._stop_runner()
        await self._drop_standby()
        self._tell(None)
        log.info("shard %s: stopped here (%s)", self.id, reason)


def export_status(shard: str, status: ReplicaStatus | None) -> None:
    """The shard's status as metrics (None: it left this member: its series go)."""
    for state in ReplicaState:
        if status is None:
            with contextlib.suppress(KeyError):
                SHARD_STATUS.remove(shard, state.name)
        else:
            SHARD_STATUS.labels(shard, state.name).set(1 if state is status.state else 0)
    if status is None:
        with contextlib.suppress(KeyError):
            RECOVERY_BEHIND.remove(shard)
    else:
        RECOVERY_BEHIND.labels(shard).set(max(0, status.to_play - status.played)
                                          if status.state is RECOVERING else 0)
