"""Two incarnations of a shard on one member never share a folder: a run left behind
(its stop timed out: the member let go of it) that ends while the shard's next run is
under way removes only its own folder, and the next run goes on."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gazette.client import AppendQueue, JournalClient
from gazette.consumer import Application, JSONFileStore, Shard, ShardRunner
from gazette.consumer.recovery import Recovery
from gazette.keyspace import Etcd
from gazette.message import Envelope, JsonMessage, Publisher
from gazette.protocol import ShardSource, ShardSpec
from gazette_broker import BrokerServer
from tests.fixtures.consumer import NDJSON, to
from tests.fixtures.recoverylog import digest, logs_client

pytestmark = pytest.mark.integration

SPECS = f"""
name: twice/
replication: 1
fragment: {{stores: ["file:///"]}}
children:
  - name: twice/in
    labels: [{{name: content-type, value: {NDJSON}}}]
  - name: twice/logs/count
"""


class HeldStore(JSONFileStore):
    """A JSON store on the shard's folder whose close waits for `held` (a store that
    is slow to stop: its member lets go of the run)."""

    def __init__(self, folder: Any, held: asyncio.Event | None) -> None:
        super().__init__(folder)
        self.held = held

    async def close(self) -> None:
        if self.held is not None:
            await self.held.wait()


class Count(Application):
    def __init__(self, held: asyncio.Event | None = None) -> None:
        self.held = held

    def new_store(self, shard: Shard) -> Any:
        return HeldStore(shard.folder, self.held)

    def consume_message(self, shard: Shard, store: Any, envelope: Envelope,
                        publisher: Publisher) -> None:
        store.state["n"] = store.state.get("n", 0) + 1


async def publish(queue: AppendQueue, n: int) -> None:
    publisher = Publisher(queue)
    for _ in range(n):
        publisher.publish_committed(to("twice/in"), JsonMessage(k=1))
    await queue.flush()


async def caught_up(client: JournalClient, runner: ShardRunner) -> None:
    head = await client.write_head("twice/in")
    await asyncio.wait_for(runner.shard.progress.wait_committed({"twice/in": head}), 30)


async def test_a_run_left_behind_never_removes_the_next_runs_folder(
        broker_server: BrokerServer, etcd: Etcd, etcd_prefix: str, tmp_path: Path) -> None:
    spec = ShardSpec("count", (ShardSource("twice/in"),), recovery_log_prefix="twice/logs",
                     hint_prefix=f"{etcd_prefix}/hints")
    recovery = Recovery(etcd, tmp_path / "member")  # one member's
    held = asyncio.Event()
    async with logs_client(broker_server, SPECS) as client, AppendQueue(client) as queue:
        await publish(queue, 50)
        first = ShardRunner(spec, Count(held), client, queue, recovery)
        first_run = asyncio.create_task(first.run())
        await caught_up(client, first)
        assert first.shard.folder is not None
        first_root = first.shard.folder.root
        first_run.cancel()  # it is stuck closing its store: left behind

        second = ShardRunner(spec, Count(), client, queue, recovery)
        second_run = asyncio.create_task(second.run())
        try:
            await publish(queue, 50)
            await caught_up(client, second)
            assert second.shard.folder is not None
            root = second.shard.folder.root
            files = digest(root)
            assert "state.json" in files

            held.set()  # the run left behind ends now
            await asyncio.gather(first_run, return_exceptions=True)
            assert digest(root) == files, "the next run's folder is as it was"
            assert root != first_root and not first_root.exists(), \
                "the run left behind removed a folder of its own"

            await publish(queue, 50)
            await caught_up(client, second)
            assert not second_run.done()
            assert second.store is not None and second.store.state == {"n": 150}  # type: ignore[attr-defined]
        finally:
            second_run.cancel()
            await asyncio.gather(second_run, return_exceptions=True)
    assert not (tmp_path / "member").exists() or not any((tmp_path / "member").rglob("*")), \
        "both runs removed their folders"
