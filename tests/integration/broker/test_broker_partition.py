"""A broker cut off from etcd stops taking appends once its lease may have expired, so
that it and the broker etcd hands its journal to never both commit (no split brain)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest

from gazette.allocator import assignments_of, route_of
from gazette.local.etcd import EmbeddedEtcd
from gazette.pb import broker_pb2 as pb
from gazette.pb import broker_pb2_grpc
from gazette_broker import BrokerServer
from tests.fixtures.broker import broker_config
from tests.fixtures.polling import eventually
from tests.fixtures.relay import Relay

pytestmark = pytest.mark.integration

SPEC = """
name: split/brain
replication: 1
fragment:
  stores: [file:///]
"""


async def test_a_partitioned_primary_stops_before_another_commits(
    etcd_server: EmbeddedEtcd, etcd_prefix: str, tmp_path: Path,
) -> None:
    async with Relay(etcd_server.endpoint.removeprefix("http://")) as relay:
        cut_off = BrokerServer(broker_config(
            f"http://{relay.address}", etcd_prefix, tmp_path, suffix="cut-off", lease_ttl=3,
            spool_dir=tmp_path / "spools-a", grace=0.5, drain_timeout=1.0))
        other = BrokerServer(broker_config(
            etcd_server.endpoint, etcd_prefix, tmp_path, suffix="other", lease_ttl=3,
            spool_dir=tmp_path / "spools-b", drain_timeout=1.0))
        commits: dict[str, list[float]] = {"cut-off": [], "other": []}
        refusals: dict[str, set[str]] = {"cut-off": set(), "other": set()}
        stop = asyncio.Event()

        async def append_to(server: BrokerServer, name: str) -> None:
            async with grpc.aio.insecure_channel(server.grpc_address) as ch:
                stub = broker_pb2_grpc.JournalStub(ch)
                while not stop.is_set():
                    resp = await stub.AppendWhole(pb.AppendRequest(
                        journal="split/brain", content=f"{name}\n".encode(),
                        do_not_proxy=True))
                    if resp.status == pb.OK:
                        commits[name].append(time.monotonic())
                    else:
                        refusals[name].add(pb.Status.Name(resp.status))
                        await asyncio.sleep(0.01)

        try:
            await cut_off.start()
            await cut_off.apply_yaml(SPEC)

            def primary(server: BrokerServer) -> str:
                route = route_of(assignments_of(server.keyspace, server.layout,
                                                "split/brain"))
                return route.primary_id.suffix if route.primary_id else ""

            await eventually(lambda: primary(cut_off) == "cut-off", "assigned", 10)
            await other.start()
            writers = [asyncio.create_task(append_to(cut_off, "cut-off")),
                       asyncio.create_task(append_to(other, "other"))]
            await eventually(lambda: len(commits["cut-off"]) > 20, "appends commit")
            relay.hold_up = relay.hold_down = True  # partitioned: etcd hears nothing
            partitioned_at = time.monotonic()
            await eventually(lambda: bool(commits["other"]), "the other broker took over",
                             20)
            await eventually(lambda: len(commits["other"]) > 20, "it commits")
            stop.set()
            await asyncio.gather(*writers)
        finally:
            stop.set()
            relay.cut()
            await other.stop()
            await cut_off.stop()
        last_cut_off = max(commits["cut-off"])
        first_other = min(commits["other"])
        print(f"\ncut-off committed until {last_cut_off - partitioned_at:.2f}s after the "
              f"partition, the other from {first_other - partitioned_at:.2f}s")
        assert last_cut_off < first_other, "two primaries committed at the same time"
        # It went on committing while its lease still held, then refused clearly.
        assert last_cut_off > partitioned_at
        assert "NOT_JOURNAL_PRIMARY_BROKER" in refusals["cut-off"]
