"""``gazette-consumer serve`` as a process, over a real etcd and broker: it joins its
application's group, runs the shards applied to etcd (what they publish shows it), and
SIGTERM drains it (its shards are released) and exits 0. A busy port is one clean line
(``gazette serve``'s too)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from typing import Any

import pytest

from gazette.allocator import assignments_of
from gazette.client import AppendQueue, JournalClient
from gazette.consumer import MemoryStore
from gazette.keyspace import Decoder, KeySpace, Layout, apply_changes
from gazette.message import JsonMessage, Publisher
from gazette.protocol import ShardSource, ShardSpec, SpecChange
from gazette_broker import BrokerServer
from tests.fixtures.consumer import SPECS, Sums, committed_outputs, to
from tests.fixtures.etcd import EtcdServer
from tests.fixtures.polling import eventually

pytestmark = pytest.mark.integration


class App(Sums):
    """Sums (its outputs on sums/output), in memory."""

    def __init__(self) -> None:
        super().__init__(MemoryStore)

    def new_store(self, shard: Any) -> Any:
        return MemoryStore()


async def test_serve_runs_shards_and_drains_on_sigterm(
        broker_server: BrokerServer, etcd_server: EtcdServer, consumer_root: str) -> None:
    await broker_server.apply_yaml(SPECS)
    layout = Layout.consumer_app("sums", consumer_root)
    env = dict(os.environ, CONSUMER_MODULE=f"{__name__}:App", CONSUMER_APP="sums",
               CONSUMER_ETCD_PREFIX=consumer_root, ETCD_ADDRESS=etcd_server.endpoint,
               BROKER_ADDRESS=broker_server.grpc_address, LOG_FORMAT="json")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gazette_consumer", "serve", "--consumer.port", "0",
        "--consumer.http-port", "0",
        "--consumer.host", "127.0.0.1", "--consumer.id", "member-0", env=env,
        stderr=asyncio.subprocess.PIPE)
    try:
        async with JournalClient(broker_server.grpc_address) as client:
            ks: KeySpace[Any] = KeySpace(broker_server.etcd, layout.root + "/",
                                         Decoder(layout, consumers=True))
            async with ks:
                await apply_changes(broker_server.etcd, layout, [
                    SpecChange("sums/shard-0", 0,
                               ShardSpec("sums/shard-0", (ShardSource("sums/input"),)))])
                await eventually(lambda: len(assignments_of(ks, layout, "sums/shard-0")) == 1,
                                 "the member takes the shard", timeout=30)
                async with AppendQueue(client) as queue:
                    publisher = Publisher(queue)
                    for n in range(1, 11):
                        publisher.publish_committed(to("sums/input"),
                                                    JsonMessage(key="a", n=n))
                    await queue.flush()

                async def summed() -> bool:
                    return (await committed_outputs(client))["a"] == 55

                await eventually(summed, "the shard's outputs sum its input", timeout=30)
                proc.send_signal(signal.SIGTERM)
                assert await asyncio.wait_for(proc.wait(), 30) == 0
                await eventually(lambda: not assignments_of(ks, layout, "sums/shard-0"),
                                 "the shard is released", timeout=10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        assert proc.stderr is not None
        err = (await proc.stderr.read()).decode()
        print(err[-4000:])  # shown if the test fails
    assert '"msg": "signalled: draining and stopping"' in err, err[-2000:]


@pytest.mark.parametrize(("command", "what"), [
    (["gazette_consumer", "serve", "--app", f"{__name__}:App", "--consumer.http-port", "0",
      "--consumer.port"], "consumer member"),
    (["gazette_broker", "serve", "--broker.http-port", "0", "--broker.port"], "broker"),
], ids=["gazette-consumer", "gazette"])
async def test_a_busy_port_is_one_clean_line(command: list[str], what: str) -> None:
    """Only our line, not gRPC core's own (``E1127 ... add_port.cc:83] Failed to add
    port ...``) before it."""
    with socket.socket(socket.AF_INET6) as busy:
        busy.bind(("::", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", *command, str(port), "--etcd.address",
            "http://127.0.0.1:1", "--log.format", "json", stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1, err.decode()
    lines = err.decode().splitlines()
    assert [line for line in lines if not line.startswith("{")] == [], err.decode()
    assert [json.loads(line)["msg"] for line in lines][-1] == (
        f"cannot start the {what}: cannot listen for gRPC on [::]:{port}: the port is in "
        f"use (another {what}?)")
