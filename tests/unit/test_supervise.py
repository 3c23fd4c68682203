"""Supervised tasks: transient failures restart (counted), others stop the process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from prometheus_client import REGISTRY

from gazette import supervise
from gazette.keyspace import EtcdError
from gazette.supervise import Supervisor, TaskFailed, await_chain, cancel_and_wait


def restarts(kind: str) -> float:
    return REGISTRY.get_sample_value("gazette_task_restarts_total", {"task": kind}) or 0.0


async def test_a_transient_failure_restarts_the_task() -> None:
    supervisor = Supervisor(transient=(EtcdError,))
    runs = 0
    done = asyncio.Event()

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        if runs < 3:
            raise EtcdError("etcd went away")
        done.set()
        await asyncio.Event().wait()  # then runs until cancelled

    before = restarts("flaky-kind")
    supervisor.spawn("flaky", flaky, kind="flaky-kind")
    await asyncio.wait_for(done.wait(), 10)
    assert runs == 3 and restarts("flaky-kind") == before + 2
    assert "flaky" in supervisor and not supervisor.failed.is_set()
    await supervisor.close()
    assert len(supervisor) == 0


async def test_a_healthy_run_starts_the_restart_delay_afresh(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 34, item 18: the delay grew while a task kept failing; once it then ran
    healthily, its next failure is restarted after the first delay again, not the
    longest one."""
    monkeypatch.setattr(supervise, "RESTART_INITIAL", 0.02)
    monkeypatch.setattr(supervise, "RESTART_MAX", 0.5)
    monkeypatch.setattr(supervise, "HEALTHY_SECONDS", 0.3, raising=False)
    supervisor = Supervisor(transient=(EtcdError,))
    loop = asyncio.get_running_loop()
    started: list[float] = []  # when each run began
    failed: list[float] = []  # when each run failed
    done = asyncio.Event()

    async def task() -> None:
        started.append(loop.time())
        if len(started) == 8:
            done.set()
            await asyncio.Event().wait()
        if len(started) == 7:
            # A healthy run (the task's own work, not a wait of the test's).
            await asyncio.sleep(0.4)
        failed.append(loop.time())
        raise EtcdError("etcd went away")

    supervisor.spawn("flaky", task)
    try:
        await asyncio.wait_for(done.wait(), 20)
    finally:
        await supervisor.close()
    delays = [s - f for f, s in zip(failed, started[1:], strict=True)]
    # Six quick failures grew the delay to RESTART_MAX (jittered: at least half of it).
    assert delays[5] >= 0.25, delays
    # The failure after the healthy run waited the first delay (at most 1.5 x 0.02 s).
    assert delays[6] < 0.15, delays


async def test_any_other_failure_is_fatal_and_said_so() -> None:
    supervisor = Supervisor(transient=(EtcdError,))

    async def buggy() -> None:
        raise KeyError("a bug")

    supervisor.spawn("buggy", buggy)
    with pytest.raises(TaskFailed, match="task buggy failed: KeyError"):
        await asyncio.wait_for(supervisor.wait_failed(), 5)
    assert isinstance(supervisor.failure, TaskFailed)
    assert isinstance(supervisor.failure.error, KeyError)
    await supervisor.close()


async def test_a_task_that_returns_is_done_and_stop_cancels_one() -> None:
    supervisor = Supervisor()
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    async def once() -> None:
        pass

    supervisor.spawn("once", once)
    supervisor.spawn("forever", forever)
    await asyncio.wait_for(started.wait(), 5)
    await asyncio.sleep(0)  # `once` has finished by now
    assert "once" not in supervisor and "forever" in supervisor
    await supervisor.stop("forever")
    assert len(supervisor) == 0 and not supervisor.failed.is_set()
    with pytest.raises(ValueError, match="already running"):
        supervisor.spawn("again", forever)
        supervisor.spawn("again", forever)
    await supervisor.close()
    with pytest.raises(RuntimeError):
        supervisor.spawn("late", forever)


async def test_cancel_and_wait_lets_the_callers_own_cancellation_through() -> None:
    """A task stopping another (a shard stopping its runner) and cancelled meanwhile
    (its member stopping) ends: swallowing that cancellation hung member.stop()."""
    runner_started, runner_stopping = asyncio.Event(), asyncio.Event()

    async def runner() -> None:
        runner_started.set()
        try:
            await asyncio.Event().wait()
        finally:
            runner_stopping.set()
            await asyncio.sleep(3600)  # a slow cleanup, cut short by the second cancel

    async def shard(task: asyncio.Task[None]) -> None:
        await cancel_and_wait(task)
        await asyncio.Event().wait()  # were the cancel swallowed, it would wait here

    inner = asyncio.create_task(runner())
    await runner_started.wait()
    outer = asyncio.create_task(shard(inner))
    await runner_stopping.wait()
    outer.cancel()
    async with asyncio.timeout(5):
        with pytest.raises(asyncio.CancelledError):
            await outer
    inner.cancel()
    async with asyncio.timeout(5):
        with pytest.raises(asyncio.CancelledError):
            await inner


async def test_cancel_and_wait_ends_whatever_the_task_ends_with() -> None:
    started = asyncio.Event()

    async def fails_on_cancel() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            raise ValueError("cleanup failed")

    task = asyncio.create_task(fails_on_cancel())
    await started.wait()
    await cancel_and_wait(task)  # neither the CancelledError nor the ValueError
    assert task.done()


async def test_cancel_and_wait_lets_go_of_a_task_that_will_not_stop(
        caplog: pytest.LogCaptureFixture) -> None:
    """A shard's runner stuck in its store's rollback must not hang its member's stop:
    after the timeout it is left behind, and the log says where it waits."""
    release, started = asyncio.Event(), asyncio.Event()

    async def stuck_in_cleanup() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            await release.wait()  # a cleanup that ignores cancellation, for a while

    task = asyncio.create_task(stuck_in_cleanup())
    await started.wait()
    async with asyncio.timeout(5):
        await cancel_and_wait(task, timeout=0.2)
    assert not task.done()
    assert "did not finish 0 s after its cancellation" in caplog.text
    assert "stuck_in_cleanup" in caplog.text and "asyncio/locks.py" in caplog.text
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_await_chain_follows_async_for_into_the_generator() -> None:
    """A read loop waits inside the generator it steps: the chain names its frames too
    (what the SIGUSR1 task dump shows of a stuck reader)."""
    started = asyncio.Event()

    async def chunks() -> AsyncIterator[int]:
        started.set()
        await asyncio.Event().wait()
        yield 1

    async def reader() -> None:
        async for _ in chunks():
            pass

    task = asyncio.create_task(reader())
    await started.wait()
    chain = await_chain(task)
    task.cancel()
    assert [line.split()[-1] for line in chain.splitlines()[:3]] == [
        "reader", "chunks", "wait"]
