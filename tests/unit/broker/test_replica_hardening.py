"""A replica under races and faults (the numbers are the items of the hardening issue):
listings racing the persister, reads racing persistence, announcements failing, and
blocking work kept off the loop."""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from gazette.allocator import Route
from gazette.cluster import Channels, Resolution
from gazette.fragment import EMPTY_SHA1, Fragment, Persister
from gazette.fragment.store import FileStore
from gazette.keyspace import EtcdError
from gazette.labels import LabelSet
from gazette.pb import broker_pb2 as pb
from gazette.protocol import CompressionCodec, FragmentSpec, JournalSpec, ProcessId
from gazette_broker.pipeline import Pipeline, ReplicationFailed
from gazette_broker.replica import Replica, Shared
from gazette_broker.replica_state import Peering

SPEC = JournalSpec("example/journal", replication=1,
                   fragment=FragmentSpec(length=4096, compression_codec=CompressionCodec.NONE,
                                         stores=("file:///store/",)))


async def one(data: bytes) -> AsyncIterator[bytes]:
    yield data


class GatedStore(FileStore):
    """A real file store whose listings can be held after they were taken: a listing
    that began before a fragment was persisted, answered after."""

    def __init__(self, url: str, file_root: Path) -> None:
        super().__init__(url, file_root)
        self.gate = asyncio.Event()
        self.gate.set()
        self.listed = asyncio.Event()

    async def list(self, journal: str) -> list[Fragment]:
        found = await super().list(journal)
        self.listed.set()
        await self.gate.wait()
        return found


async def test_a_listing_racing_the_persister_skips_nothing(tmp_path: Path) -> None:
    """1: a fragment persisted while a listing was in flight stays readable (the bug:
    the stale listing dropped it, and reads skipped its bytes)."""
    store = GatedStore("file:///store/", tmp_path / "root")
    persister = Persister()
    task = asyncio.create_task(persister.run())
    try:
        r = Replica(SPEC, tmp_path / "spools", Shared(persister, lambda url: store))
        first, second = b"a" * 1000 + b"\n", b"b" * 1000 + b"\n"
        await r.append(one(first))
        await r.roll()
        await asyncio.wait_for(persister.wait_idle(), 10)
        await r.append(one(second))
        store.gate.clear()
        store.listed.clear()
        refresh = asyncio.create_task(r.refresh())
        await asyncio.wait_for(store.listed.wait(), 10)  # the listing lacks `second`
        await r.roll()
        await asyncio.wait_for(persister.wait_idle(), 10)  # persisted, local file gone
        store.gate.set()
        await asyncio.wait_for(refresh, 10)
        assert b"".join([c.content async for c in r.read(0)]) == first + second
    finally:
        task.cancel()


async def test_reads_racing_persistence_are_never_cut(tmp_path: Path) -> None:
    """12: a reader re-reading from 0 while small fragments roll and persist (the bug:
    a closed spool persisted and removed mid-read cut the read with KeyError)."""
    store = FileStore("file:///store/", tmp_path / "root")
    persister = Persister()
    task = asyncio.create_task(persister.run())
    r = Replica(SPEC, tmp_path / "spools", Shared(persister, lambda url: store))
    written = bytearray()
    stop = asyncio.Event()

    async def write() -> None:
        i = 0
        while not stop.is_set():
            record = b"%06d %s\n" % (i, b"x" * (i % 300))
            await r.append(one(record))
            written.extend(record)
            i += 1
            await asyncio.sleep(0.001)  # paced: fragments roll often, reads keep up

    writer = asyncio.create_task(write())
    reads = 0
    try:
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            head = r.write_head
            if not head:
                await asyncio.sleep(0.01)  # the writer's first append comes
                continue
            got = b"".join([c.content async for c in r.read(0, end_offset=head)])
            assert got == bytes(written[:head]), f"read {reads} of [0, {head}) differs"
            reads += 1
            await asyncio.sleep(0.005)  # the writer goes on between reads
    finally:
        stop.set()
        await writer
        task.cancel()
    assert reads > 20 and len(r.fragments()) > 5


async def test_the_run_loop_survives_failed_announcements(tmp_path: Path) -> None:
    """2: announcing a synced route failed (etcd down) and the replica's loop ended
    silently; now it is retried with backoff and counted."""
    me = ProcessId("zone", "me")
    calls: list[Route] = []

    async def announce(journal: str, route: Route) -> bool:
        calls.append(route)
        if len(calls) < 3:
            raise EtcdError("etcd is unreachable")
        return True

    peering = Peering(me, Channels(), lambda res: pb.Header(), announce)
    r = Replica(SPEC, tmp_path, Shared(peering=peering))
    route = Route((me,), 0)
    failures = REGISTRY.get_sample_value("gazette_broker_sync_failures_total") or 0
    r.update_route(Resolution(SPEC.name, SPEC, route, ("http://me:1",), 1))
    task = asyncio.create_task(r.run())
    try:
        deadline = time.monotonic() + 10
        while r.as_primary.announced != route:
            assert not task.done(), f"the loop ended: {task}"
            assert time.monotonic() < deadline, "never announced"
            await asyncio.sleep(0.02)
        assert len(calls) == 3
        assert (REGISTRY.get_sample_value("gazette_broker_sync_failures_total") or 0) \
            == failures + 2
    finally:
        task.cancel()


async def test_rolls_and_large_reads_run_off_the_loop(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """10: creating spool files and 1 MiB reads of spools ran on the event loop. Now
    a read on the loop is one that cannot wait for the disk (``RWF_NOWAIT``: served from
    the page cache, or refused and done in a thread); anything else runs in a thread."""
    loop_thread = threading.current_thread()
    on_loop: list[str] = []
    mkstemp, pread, preadv = tempfile.mkstemp, os.pread, os.preadv

    def watched_mkstemp(*args: object, **kw: object) -> object:
        if threading.current_thread() is loop_thread:
            on_loop.append("mkstemp")
        return mkstemp(*args, **kw)  # type: ignore[call-overload]

    def watched_pread(fd: int, n: int, offset: int) -> bytes:
        if n >= 1 << 20 and threading.current_thread() is loop_thread:
            on_loop.append(f"pread {n}")
        return pread(fd, n, offset)

    def watched_preadv(fd: int, buffers: list[bytearray], offset: int, flags: int = 0
                       ) -> int:
        if threading.current_thread() is loop_thread and not flags & os.RWF_NOWAIT:
            on_loop.append("preadv that may wait")
        return preadv(fd, buffers, offset, flags)

    spec = JournalSpec("example/journal", replication=1,
                       fragment=FragmentSpec(length=64 << 20, stores=()))
    r = await Replica.open(spec, tmp_path)
    monkeypatch.setattr(tempfile, "mkstemp", watched_mkstemp)
    monkeypatch.setattr(os, "pread", watched_pread)
    monkeypatch.setattr(os, "preadv", watched_preadv)
    await r.append(one(os.urandom(3 << 20)))
    got = [len(c.content) async for c in r.read(0)]
    await r.roll()
    assert sum(got) == 3 << 20 and on_loop == []


async def test_a_pipeline_to_a_peer_without_an_endpoint_opens_no_stream() -> None:
    """10: `Pipeline.open` opened streams to the peers before one without an endpoint,
    and left them open."""
    channels = Channels()
    peers = [(ProcessId("z", "reachable"), "http://127.0.0.1:9"), (ProcessId("z", "gone"), "")]
    route = Route(tuple(sorted(p for p, _ in peers)), 0)
    with pytest.raises(ReplicationFailed, match="has no endpoint"):
        await Pipeline.open("example/journal", route, pb.Header(), peers, channels,
                            Fragment("example/journal", 0, 0, EMPTY_SHA1), LabelSet())
    assert channels._channels == {}  # nothing was opened, so nothing leaks
    await channels.close()


async def test_an_assignment_seen_without_the_route_while_announcing_is_announced_again(
        tmp_path: Path) -> None:
    """An assignment moved to another slot (a new key without the route) came while the
    primary's announcement was in flight: that announcement, written before the new key,
    was taken as done, and the allocator waited for ever (a fault test left a journal
    unrouted for 40 s). Now the primary announces once more."""
    me = ProcessId("zone", "me")
    calls: list[Route] = []
    in_flight, release = asyncio.Event(), asyncio.Event()

    async def announce(journal: str, route: Route) -> bool:
        calls.append(route)
        if len(calls) == 1:
            in_flight.set()
            await release.wait()
        return True

    peering = Peering(me, Channels(), lambda res: pb.Header(), announce)
    r = Replica(SPEC, tmp_path, Shared(peering=peering))
    route = Route((me,), 0)
    res = Resolution(SPEC.name, SPEC, route, ("http://me:1",), 1)
    r.update_route(res)
    task = asyncio.create_task(r.run())
    try:
        async with asyncio.timeout(10):
            await in_flight.wait()
            r.update_route(Resolution(SPEC.name, SPEC, route, ("http://me:1",), 2,
                                      announced=False))
            release.set()
            while len(calls) < 2 or r.as_primary.announced != route:
                assert not task.done(), f"the loop ended: {task}"
                await asyncio.sleep(0.02)
        assert calls == [route, route]
    finally:
        task.cancel()
