"""Faults against a three-broker cluster (two zones) holding a journal of replication 3,
while writers append self-describing records: primaries are SIGKILLed and restarted,
another broker is SIGTERMed (drained) and restarted, and etcd is restarted. Afterwards
every acknowledged record is there exactly once, in its writer's order, no record is
torn or interleaved, every persisted fragment's SHA-1 checks, and every broker returns
the same bytes. Mutual TLS and authorization are on throughout (etcd's too)."""

from __future__ import annotations

import asyncio
import hashlib
import signal
import time
from collections import defaultdict
from pathlib import Path

import pytest

from gazette.allocator import assignments_of, route_of
from gazette.auth import Capability
from gazette.keyspace import Etcd, KeySpace, Layout
from gazette.keyspace.specs import Decoder, apply_changes
from gazette.local.etcd import EmbeddedEtcd
from gazette.local.process import free_port
from gazette.pb import broker_pb2 as pb
from gazette.pb import broker_pb2_grpc
from gazette.protocol.trees import journal_changes_from_yaml
from tests.fault.cluster import Broker, Writer, parse, read_from
from tests.fixtures.polling import eventually
from tests.fixtures.security import ClusterSecurity

pytestmark = pytest.mark.integration

JOURNAL = "faults/journal"
PREFIX = "/gazette/faults"
LEASE_TTL = 4
WRITERS = 4
SPEC = f"""
name: {JOURNAL}
replication: 3
fragment:
  stores: [file:///]
  length: 65536
  compression_codec: NONE
  flush_interval: 2s
"""


async def test_faults_lose_no_acknowledged_append(tmp_path: Path) -> None:
    started = time.monotonic()
    security = ClusterSecurity.make(tmp_path / "pki")
    etcd = EmbeddedEtcd(tmp_path / "etcd", tls=security.etcd_tls)
    await asyncio.to_thread(etcd.start)
    brokers = [Broker(zone, f"broker-{i}", free_port(), tmp_path, etcd.endpoint, PREFIX,
                      LEASE_TTL, security)
               for i, zone in enumerate(["zone-a", "zone-a", "zone-b"])]
    layout = Layout(PREFIX)
    stop = asyncio.Event()
    # Each writer may append to the journal only.
    writers = [Writer(i, JOURNAL, security.client(Capability.APPEND,
                                                  selector=f"name={JOURNAL}"))
               for i in range(WRITERS)]
    faults: list[str] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        for b in brokers:
            b.start()
        async with Etcd(etcd.endpoint, tls=security.etcd_tls) as client, \
                KeySpace(client, layout.root + "/", Decoder(layout)) as keyspace:

            def route_ok(members: int = 3) -> bool:
                assigned = assignments_of(keyspace, layout, JOURNAL)
                route = route_of(assigned)
                return len(assigned) == members and route.primary >= 0 and all(
                    a.value == route.encode() for a in assigned)

            def primary() -> Broker | None:
                route = route_of(assignments_of(keyspace, layout, JOURNAL))
                return next((b for b in brokers if b.id == route.primary_id), None)

            await eventually(lambda: len(keyspace.prefixed(layout.members)) == 3,
                             "three brokers joined", 30)
            await apply_changes(client, layout, journal_changes_from_yaml(SPEC))
            await eventually(route_ok, "the journal is assigned to all three", 30)

            target = "ipv4:" + ",".join(b.address for b in brokers)
            tasks = [asyncio.create_task(w.run(target, stop)) for w in writers]

            def acked() -> int:
                return sum(len(w.acked) for w in writers)

            async def progress(more: int = 500, timeout: float = 40) -> None:
                goal = acked() + more
                await eventually(lambda: acked() >= goal, f"{more} more acknowledged "
                                 f"appends (faults so far: {faults})", timeout)

            async def restart(b: Broker) -> None:
                b.start()
                await eventually(lambda: route_ok(3), f"{b.name} rejoined the route", 40)

            await progress()
            for round_ in range(2):
                victim = primary()
                assert victim is not None
                await asyncio.to_thread(victim.process.kill)
                faults.append(f"SIGKILL {victim.name} (primary)")
                # Its lease expires, taking its member key and assignments: another
                # broker is primary then (with two of three brokers appends are refused
                # as INSUFFICIENT_JOURNAL_BROKERS until it is back).
                key = layout.member_key(victim.zone, victim.name)
                await eventually(lambda key=key: keyspace.get(key) is None,
                                 "the killed broker's lease expired", 3 * LEASE_TTL)
                await eventually(lambda victim=victim: primary() is not victim,
                                 "another broker is primary", 3 * LEASE_TTL)
                await restart(victim)
                await progress()
                # SIGTERM (drain) a broker that is not the primary, then the primary.
                other = next(b for b in brokers if (b is primary()) == (round_ == 1))
                await asyncio.to_thread(other.process.stop, 30.0)
                faults.append(f"SIGTERM {other.name}{' (primary)' if round_ else ''}")
                assert other.process.popen is not None
                assert other.process.popen.returncode == 0, "a drained broker exits 0"
                await restart(other)
                await progress()
            await asyncio.to_thread(etcd.restart)
            faults.append("etcd restart")
            await progress()
            # A rolling restart: each broker in turn drained (SIGTERM) and started again.
            rolling_from = time.monotonic()
            for b in brokers:
                await asyncio.to_thread(b.process.stop, 30.0)
                faults.append(f"SIGTERM {b.name} (rolling restart)")
                await restart(b)
            await progress()
            rolling_to = time.monotonic()
            stop.set()
            await asyncio.gather(*tasks)

            # Every broker serves the whole journal, identically.
            await eventually(route_ok, "the route is consistent", 30)
            head = 0
            now_primary = primary()
            assert now_primary is not None
            async with security.channel(now_primary.address) as ch:
                resp = await anext(aiter(broker_pb2_grpc.JournalStub(ch).Read(
                    pb.ReadRequest(journal=JOURNAL, offset=-1, metadata_only=True,
                                   do_not_proxy=True))))
                head = resp.write_head
            contents = [await read_from(b, JOURNAL, head) for b in brokers]
    finally:
        stop.set()
        for t in tasks:
            t.cancel()
        for b in brokers:
            await asyncio.to_thread(b.process.stop, 20.0, signal.SIGKILL)
        await asyncio.to_thread(etcd.stop)

    assert len(contents[0]) == head > 0
    for b, content in zip(brokers, contents, strict=True):
        assert content == contents[0], f"{b.name} serves other bytes"
    records = parse(contents[0])
    by_writer: dict[int, list[int]] = defaultdict(list)
    for w, seq in records:
        by_writer[w].append(seq)
    for w in writers:
        seqs = by_writer[w.id]
        assert seqs == sorted(set(seqs)), f"writer {w.id}: out of order or duplicated"
        present = set(seqs)
        assert set(w.acked) <= present, f"writer {w.id}: acknowledged records lost: " \
            f"{sorted(set(w.acked) - present)[:10]}"
        assert present <= set(w.acked) | w.uncertain, \
            f"writer {w.id}: records never acknowledged nor in doubt are present"
    # Every persisted fragment's name matches its content.
    fragments = sorted((tmp_path / "store").rglob("*.raw"))
    assert fragments
    for path in fragments:
        begin, end, sha1 = path.stem.split("-")
        data = path.read_bytes()
        assert len(data) == int(end, 16) - int(begin, 16)
        assert hashlib.sha1(data).hexdigest() == sha1, f"{path.name}: SHA-1 does not check"
    # Appends were refused (retried) only while a hand-off lasted: the longest time no
    # writer got an acknowledgment during the rolling restart.
    acks = sorted(t for w in writers for t in w.acked_at if rolling_from <= t <= rolling_to)
    longest_pause = max(b - a for a, b in zip([rolling_from, *acks], acks, strict=False))
    assert longest_pause < 15, f"appends paused {longest_pause:.1f}s in a rolling restart"
    total = sum(len(w.acked) for w in writers)
    uncertain = sum(len(w.uncertain) for w in writers)
    refused = sum(len(w.refused) for w in writers)
    print(f"\nfault test: {total} appends acknowledged, {uncertain} uncertain, "
          f"{refused} refused, "
          f"{len(faults)} faults injected ({'; '.join(faults)}), "
          f"{len(fragments)} fragments persisted, longest pause in the rolling restart "
          f"{longest_pause:.1f}s, {time.monotonic() - started:.0f}s")
