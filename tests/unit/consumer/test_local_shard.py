"""A shard on its member (`LocalShard`): a run ended by a transient fault (a broker out of
reach) runs again after a backoff, showing RECOVERING with the error meanwhile; any other
failure marks it FAILED until its spec or its role changes. The runner here is a stand-in
that fails as told (what runs inside a real one is tested in integration)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gazette.client import BrokerError, Unavailable
from gazette.cluster import Resolution
from gazette.consumer import shard as shard_module
from gazette.consumer.shard import LocalShard
from gazette.protocol import (
    ProcessId,
    ReplicaState,
    ReplicaStatus,
    Route,
    ShardSource,
    ShardSpec,
    Status,
)

ME = ProcessId("z", "me")
SPEC = ShardSpec("app/shard-0", (ShardSource("in/a"),))


class Runner:
    """Fails with the next of `failures` each run; runs (restored) when none is left."""

    def __init__(self, spec: ShardSpec, failures: list[BaseException]) -> None:
        self.spec, self.failures = spec, failures
        self.on_restored: Any = None
        self.on_progress: Any = None
        self.standby: Any = None

    async def run(self) -> None:
        if self.failures:
            raise self.failures.pop(0)
        self.on_restored()
        await asyncio.Event().wait()


@contextlib.asynccontextmanager
async def running(failures: list[BaseException], live: Any = lambda: True
                  ) -> AsyncIterator[tuple[LocalShard, list[ReplicaStatus | None], list[Any]]]:
    statuses: list[ReplicaStatus | None] = []
    runs: list[Any] = []

    def new_runner(spec: ShardSpec) -> Any:
        runs.append(Runner(spec, failures))
        return runs[-1]

    async def announce(item: str, route: Any) -> bool:
        return True

    shard = LocalShard(SPEC, ME, new_runner, announce, lambda _, s: statuses.append(s),
                       live=live)
    shard.update_route(Resolution(SPEC.id, SPEC, Route((ME,), 0), ("",), 1))
    task = asyncio.create_task(shard.run())
    try:
        yield shard, statuses, runs
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(check: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():  # noqa: ASYNC110 - polling state under a deadline
            await asyncio.sleep(0.01)


async def test_a_transient_failure_runs_the_shard_again_after_a_backoff(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shard_module, "RESTART_FIRST_SECONDS", 0.05)
    restarts = shard_module.SHARD_RESTARTS._value.get()
    down = Unavailable("read", "127.0.0.1:1", "UNAVAILABLE", "connection refused", "in/a")
    async with running([down, down]) as (shard, statuses, runs):
        await until(lambda: shard.status.state == ReplicaState.PRIMARY)
        assert len(runs) == 3
        waiting = [s for s in statuses if s is not None and s.state == ReplicaState.RECOVERING
                   and s.error]
        assert waiting and "Unavailable" in waiting[0].error
        assert "running again in 0.1s" in waiting[-1].error  # the backoff doubled
        assert not any(s is not None and s.state == ReplicaState.FAILED for s in statuses)
        # Between runs it showed only that it is recovering (never a standby, say).
        assert {s.state for s in statuses if s is not None} == {
            ReplicaState.PENDING, ReplicaState.RECOVERING, ReplicaState.PRIMARY}
    assert shard_module.SHARD_RESTARTS._value.get() == restarts + 2


async def test_another_failure_leaves_the_shard_failed() -> None:
    async with running([ValueError("the app broke")]) as (shard, _, runs):
        await until(lambda: shard.status.state == ReplicaState.FAILED)
        assert shard.status.error == "ValueError: the app broke"
        await shard._converge()  # another pass, as any change would bring: no new run
        assert len(runs) == 1 and shard.status.state == ReplicaState.FAILED


async def test_a_refusal_that_wrote_nothing_runs_the_shard_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 34, item 14: a broker outage longer than the client's retry budget ends a
    run with a refusal that says nothing was written and to retry (too few brokers, a
    route changing, a store not taking fragments yet, also as the cause of another
    error): the shard runs again once it passes, never stays FAILED."""
    monkeypatch.setattr(shard_module, "RESTART_FIRST_SECONDS", 0.01)
    too_few = BrokerError(Status.INSUFFICIENT_JOURNAL_BROKERS, "out/a",
                          "nothing was written; still so after 10 attempts")
    wrapped = RuntimeError("recording the store failed")
    wrapped.__cause__ = BrokerError(Status.FRAGMENT_STORE_UNHEALTHY, "logs/a", "retry later")
    moving = BrokerError(Status.NO_JOURNAL_PRIMARY_BROKER, "in/a")
    async with running([too_few, wrapped, moving]) as (shard, statuses, runs):
        await until(lambda: shard.status.state == ReplicaState.PRIMARY)
        assert len(runs) == 4
        assert not any(s is not None and s.state == ReplicaState.FAILED for s in statuses)


async def test_a_refusal_that_will_not_pass_leaves_the_shard_failed() -> None:
    async with running([BrokerError(Status.JOURNAL_NOT_FOUND, "in/a")]) as (shard, _, _):
        await until(lambda: shard.status.state == ReplicaState.FAILED)
        assert "JOURNAL_NOT_FOUND" in shard.status.error


async def test_a_primary_stops_while_its_members_lease_may_have_run_out() -> None:
    """Issue 34, item 15: while etcd does not answer and the member's lease may have
    run out by its own clock, the primary does not run; once etcd refreshed the lease,
    it runs again (the member did not exit)."""
    live = True
    async with running([], live=lambda: live) as (shard, _, runs):
        await until(lambda: shard.status.state == ReplicaState.PRIMARY)
        live = False
        shard.update_live()
        await until(lambda: shard.runner is None)
        assert shard.status.state == ReplicaState.RECOVERING
        assert "lease may have run out" in shard.status.error
        live = True
        shard.update_live()
        await until(lambda: shard.status.state == ReplicaState.PRIMARY)
        assert len(runs) == 2
