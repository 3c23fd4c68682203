"""Broker hardening: what a code review and a careless new user found, one test each
(the numbers are the items of the hardening issue). Real etcd, real brokers in-process."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from prometheus_client import REGISTRY

from gazette.client import BrokerError, FragmentInfo, JournalClient
from gazette.fragment import JournalIndex
from gazette.keyspace import Etcd, EtcdError
from gazette.keyspace.specs import apply_changes
from gazette.labels import LabelSet
from gazette.local.etcd import EmbeddedEtcd
from gazette.local.process import free_port
from gazette.pb import broker_pb2 as pb
from gazette.pb import broker_pb2_grpc
from gazette.protocol import JournalSpec
from gazette.protocol.trees import SpecChange, journal_changes_from_yaml
from gazette.supervise import TaskFailed
from gazette_broker import BrokerServer
from gazette_broker import replica as replica_module
from tests.fixtures.broker import broker_config
from tests.fixtures.polling import eventually
from tests.fixtures.procs import run_process
from tests.fixtures.relay import Relay

pytestmark = pytest.mark.integration


def spec_yaml(name: str, replication: int = 1, **fragment: object) -> str:
    """A journal spec (YAML is a superset of JSON)."""
    frag = {"stores": ["file:///"], "compression_codec": "NONE", **fragment}
    return json.dumps({"name": name, "replication": replication, "fragment": frag})


@contextlib.asynccontextmanager
async def broker(etcd_server: EmbeddedEtcd, etcd_prefix: str, workdir: Path,
                 **overrides: object) -> AsyncIterator[BrokerServer]:
    server = BrokerServer(broker_config(etcd_server.endpoint, etcd_prefix, workdir,
                                        **overrides))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def delete(server: BrokerServer, journal: str) -> None:
    async with JournalClient(server.grpc_address) as client:
        listed = (await client.list(f"name={journal}")).journals
        await client.apply([SpecChange(journal, listed[0].mod_revision, None)])


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# -- 4. removing a replica releases all it holds --------------------------------------


async def test_removed_replicas_release_their_spools_and_descriptors(
    etcd_server: EmbeddedEtcd, etcd_prefix: str, tmp_path: Path,
) -> None:
    """50 journals created, appended to and deleted: no descriptor, spool file or
    cached state is left behind (the bug: each removal opened a spool never closed)."""
    async with broker(etcd_server, etcd_prefix, tmp_path) as server, \
            JournalClient(server.grpc_address) as client:
        await server.apply_yaml(spec_yaml("leak/warm-up"))
        await client.append("leak/warm-up", b"warm\n")
        await delete(server, "leak/warm-up")
        await eventually(lambda: not server.broker.replicas, "the warm-up is gone")
        await server.broker.wait_closed()
        await asyncio.wait_for(server.broker.persister.wait_idle(), 20)
        before = open_fds()
        for i in range(50):
            name = f"leak/j{i}"
            await server.apply_yaml(spec_yaml(name))
            await client.append(name, b"record %d\n" % i)
            await delete(server, name)
            await eventually(lambda n=name: n not in server.broker.replicas, f"{name} gone")
        await server.broker.wait_closed()
        await asyncio.wait_for(server.broker.persister.wait_idle(), 20)
        gc.collect()
        assert open_fds() <= before + 3, "descriptors leaked by removed replicas"
        left = [p for p in server.spool_dir.rglob("spool-*")]
        assert left == [], f"spool files left behind: {left[:3]}"
        # Nothing of a deleted journal stays in the broker (one index per replica).
        kept = [o.journal for o in gc.get_objects()
                if type(o) is JournalIndex and o.journal.startswith("leak/")]
        assert kept == [], f"indexes of deleted journals kept: {kept[:5]}"
        stored = sorted(p.parent.name for p in (tmp_path / "fragment-store" / "leak")
                        .rglob("*.raw"))
        assert len(stored) == 51  # every journal's content was persisted on removal


# -- 6. a client does not control how long the broker waits -----------------------------


async def test_a_header_from_the_future_is_refused_at_once(
    etcd_server: EmbeddedEtcd, etcd_prefix: str, tmp_path: Path,
) -> None:
    async with broker(etcd_server, etcd_prefix, tmp_path) as server:
        await server.apply_yaml(spec_yaml("future/journal"))
        ahead = server.keyspace.revision + 1_000_000
        async with grpc.aio.insecure_channel(server.grpc_address) as ch:
            stub = broker_pb2_grpc.JournalStub(ch)
            for _ in range(3):
                started = time.monotonic()
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    async for _ in stub.Read(pb.ReadRequest(
                            journal="future/journal", header=pb.Header(
                                etcd=pb.Header.Etcd(revision=ahead)))):
                        pass
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "header.etcd.revision" in (err.value.details() or "")
                assert time.monotonic() - started < 2.0  # not after a 5 s stall
        assert server.keyspace._waiters == []  # no waiter left behind


# -- 7. a stalled append stream does not hold its journal ------------------------------


async def test_a_stalled_append_is_aborted_and_frees_the_journal(
    etcd_server: EmbeddedEtcd, etcd_prefix: str, tmp_path: Path,
) -> None:
    async with broker(etcd_server, etcd_prefix, tmp_path, append_idle_timeout=1.0) as server, \
            JournalClient(server.grpc_address) as client:
        await server.apply_yaml(spec_yaml("stall/journal"))
        async with grpc.aio.insecure_channel(server.grpc_address) as ch:
            call = broker_pb2_grpc.JournalStub(ch).Append()
            await call.write(pb.AppendRequest(journal="stall/journal"))
            await call.write(pb.AppendRequest(content=b"half of an append"))
            # ... and nothing more: the client stalls. Another append gets through once
            # the stalled one is aborted.
            started = time.monotonic()
            result = await asyncio.wait_for(client.append("stall/journal", b"next\n"), 10)
            assert time.monotonic() - started < 5
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await asyncio.wait_for(call, 10)
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "nothing was appended" in (err.value.details() or "")
        assert result.commit.begin == 0
        content = b"".join([c.content async for c in client.read("stall/journal")])
        assert content == b"next\n"


# -- 11. a blocking read of a deleted journal ends --------------------------------------


async def test_a_blocking_read_of_a_deleted_then_recreated_journal_ends(
    etcd_server: EmbeddedEtcd, etcd_prefix: str, tmp_path: Path,
) -> None:
    """The bug: the old replica's wait returned at once for ever once a new journal of
    the same name was appended to: 100 % CPU, SIGTERM ignored."""
    async with broker(etcd_server, etcd_prefix, tmp_path) as server, \
            JournalClient(server.grpc_address) as client, aiohttp.ClientSession() as http:
        name = "again/journal"
        await server.apply_yaml(spec_yaml(name))
        await client.append(name, b"first life\n")
        got: list[bytes] = []

        async def follow() -> None:
            async for chunk in client.read(name, 0, block=True):
                got.append(chunk.content)

        reader = asyncio.create_task(follow())
        response = await http.get(f"{server.http_url}/{name}?block=true&offset=0")
        assert (await response.content.readexactly(11)) == b"first life\n"
        await eventually(lambda: got == [b"first life\n"], "the gRPC reader got content")
        await delete(server, name)
        await server.apply_yaml(spec_yaml(name))
        await client.append(name, b"second life, longer\n")
        with pytest.raises(BrokerError) as err:
            await asyncio.wait_for(reader, 10)
        assert err.value.status == "JOURNAL_NOT_FOUND"
        # The HTTP reader's response ends too (cut: it was not read to its end).
        with pytest.raises((aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError)):
            await asyncio.wait_for(response.content.read(), 10)
        response.release()
        # And the broker is idle, not spinning.
        cpu = time.process_time()
        await asyncio.sleep(1.0)  # measuring CPU over a second is the point
        assert time.process_time() - cpu < 0.5
        assert b"".join([c.content async for c in client.read(name)]) == \
            b"second life, longer\n"


# -- 15. two brokers on one port ----------------------------------------------------------


async def test_a_second_broker_on_a_busy_port_is_refused(
    etcd_server: EmbeddedEtcd, etcd_prefix: str, tmp_path: Path,
) -> None:
    async with broker(etcd_server, etcd_prefix, tmp_path / "a") as first:
        second = BrokerServer(broker_config(etcd_server.endpoint, etcd_prefix,
                                            tmp_path / "b", port=first.grpc_port))
        with pytest.raises(OSError, match="in use"):
            await second.start()
        assert len(first.keyspace.prefixed(first.layout.members)) == 1


# -- 2. long-lived tasks are supervised ----------------------------------------------------


async def test_a_task_failing_for_good_stops_the_broker(
    etcd_server: EmbeddedEtcd, etcd_prefix: str, tmp_path: Path,
) -> None:
    """A task that cannot recover makes `wait()` raise, so `gazette serve` exits 1 (and
    Kubernetes restarts it) rather than serving half-alive."""
    async with broker(etcd_server, etcd_prefix, tmp_path) as server:

        async def broken() -> None:
            raise RuntimeError("a bug")

        waiting = asyncio.create_task(server.wait())
        server.broker.supervisor.spawn("broken", broken, transient=())
        with pytest.raises(TaskFailed, match="task broken failed: RuntimeError: a bug"):
            await asyncio.wait_for(waiting, 10)


async def test_the_allocator_is_restarted_after_etcd_fails(
    etcd_server: EmbeddedEtcd, etcd_prefix: str, tmp_path: Path,
) -> None:
    """The allocator loop ended on any etcd error but a conflict: journals created after
    that were never assigned. Its etcd goes through a relay here, refused for a while."""
    async with Relay(etcd_server.endpoint.removeprefix("http://")) as relay, \
            broker(etcd_server, etcd_prefix, tmp_path) as server:
        relayed = Etcd(f"http://{relay.address}", timeout=1.0)
        await relayed.connect()
        allocator = server.membership.allocator
        await server.broker.supervisor.stop("allocator")
        allocator.etcd = relayed  # its writes now go through the relay
        server.broker.supervisor.spawn("allocator", allocator.run,
                                       transient=(EtcdError, OSError))
        restarts = REGISTRY.get_sample_value("gazette_task_restarts_total",
                                             {"task": "allocator"}) or 0
        relay.refuse = True
        relay.cut()
        async with Etcd(etcd_server.endpoint) as etcd:
            await apply_changes(etcd, server.layout,
                                journal_changes_from_yaml(spec_yaml("alloc/one")))
        await eventually(lambda: (REGISTRY.get_sample_value(
            "gazette_task_restarts_total", {"task": "allocator"}) or 0) > restarts,
            "the allocator failed and was restarted", 20)
        relay.refuse = False
        await eventually(lambda: "alloc/one" in server.broker.replicas,
                         "the journal is assigned after etcd is back", 30)
    # Closed once the broker stopped: its drain needs the allocator's writes (closed
    # before, each stop waited the whole drain timeout).
    await relayed.close()


# -- 3. a failing store shows in gazctl ----------------------------------------------------


async def test_gazctl_fragments_shows_why_a_store_fails(
    etcd_server: EmbeddedEtcd, etcd_prefix: str, tmp_path: Path,
) -> None:
    async with broker(etcd_server, etcd_prefix, tmp_path) as server, \
            JournalClient(server.grpc_address) as client:
        root = tmp_path / "fragment-store"
        root.mkdir(exist_ok=True)
        (root / "failing").write_text("not a folder\n")
        await server.apply_yaml(spec_yaml("show/failing", stores=["file:///failing/"]))
        await client.append("show/failing", b"kept locally\n")
        await server.broker.replicas["show/failing"].roll()
        infos: list[FragmentInfo] = []

        async def failing() -> bool:
            nonlocal infos
            infos = await client.list_fragments("show/failing")
            return bool(infos) and bool(infos[0].persist_error)

        await eventually(failing, "the upload failed", 10)
        assert "NotADirectoryError" in infos[0].persist_error
        env = dict(os.environ, BROKER_ADDRESS=server.grpc_address)
        status, out, err = await run_process(
            [sys.executable, "-m", "gazette.gazctl", "journals", "fragments", "-l",
             "name=show/failing"], env)
        assert status == 0, err
        assert "failing: StoreError" in out.decode() or "NotADirectoryError" in out.decode()
        # (Its store still fails: stopping, the broker gives its spool up at once.)
        server.config = replace(server.config, persist_timeout=0.5)


# -- 8. memory and disk are bounded -----------------------------------------------------


async def test_every_journal_shares_one_bounded_cache(
    etcd_server: EmbeddedEtcd, etcd_prefix: str, tmp_path: Path,
) -> None:
    """The cache of persisted fragments was 4 GiB per journal; it is one budget now."""
    async with broker(etcd_server, etcd_prefix, tmp_path, cache_bytes=100_000) as server, \
            JournalClient(server.grpc_address) as client:
        names = [f"cache/j{i}" for i in range(4)]
        for name in names:
            await server.apply_yaml(spec_yaml(name))
            for _ in range(3):
                await client.append(name, os.urandom(30_000))
                await server.broker.replicas[name].roll()
        await asyncio.wait_for(server.broker.persister.wait_idle(), 20)
        for name in names:
            assert len([c async for c in client.read(name)]) >= 3  # from the cache
        caches = {id(server.broker.replicas[n].state.cache) for n in names}
        assert len(caches) == 1
        cache = server.broker.shared.cache
        assert cache is not None
        size = sum(p.stat().st_size for p in cache.directory.iterdir() if p.is_file())
        assert 0 < size <= 100_000


async def test_appends_wait_then_are_refused_past_the_unpersisted_budget(
    etcd_server: EmbeddedEtcd, etcd_prefix: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Spools waiting for a failing store filled the disk without bound; now appends to
    that store's journals wait, then are refused, and others go on."""
    monkeypatch.setattr(replica_module, "ROOM_WAIT_SECONDS", 0.5)
    async with broker(etcd_server, etcd_prefix, tmp_path,
                      max_unpersisted_bytes=50_000) as server, \
            JournalClient(server.grpc_address) as client:
        root = tmp_path / "fragment-store"
        root.mkdir(exist_ok=True)
        (root / "failing").write_text("not a folder\n")
        await server.apply_yaml(spec_yaml("budget/failing", stores=["file:///failing/"],
                                          length=20_000))
        await server.apply_yaml(spec_yaml("budget/healthy", length=20_000))
        with pytest.raises(BrokerError) as err:
            for _ in range(10):
                await client.append("budget/failing", os.urandom(30_000))
        assert err.value.status == "FRAGMENT_STORE_UNHEALTHY"
        assert "wait to be persisted to file:///failing/" in str(err.value)
        assert "NotADirectoryError" in str(err.value)
        for _ in range(5):  # another store's journal is not held up
            await client.append("budget/healthy", os.urandom(30_000))
        (root / "failing").unlink()  # healed: the backlog drains, appends go again
        await eventually(lambda: server.broker.persister.has_room("file:///failing/"),
                         "the backlog drained", 20)
        await client.append("budget/failing", b"after\n")


# -- 9. one etcd change costs one journal's work ----------------------------------------


async def test_a_change_touches_only_its_journal(
    etcd_server: EmbeddedEtcd, etcd_prefix: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`Broker.sync` rescanned and resolved every journal on every etcd event."""
    async with broker(etcd_server, etcd_prefix, tmp_path) as server:
        tree = "name: many/\nreplication: 1\nfragment: {stores: [file:///]}\nchildren:\n" + \
            "".join(f"  - name: many/j{i:03d}\n" for i in range(100))
        await server.apply_yaml(tree, timeout=30)
        resolver = server.broker.resolver
        assert resolver is not None
        resolved: list[str] = []
        resolve = resolver.resolve

        def counted(journal: str) -> Any:
            resolved.append(journal)
            return resolve(journal)

        monkeypatch.setattr(resolver, "resolve", counted)
        async with JournalClient(server.grpc_address) as client:
            listed = (await client.list("name=many/j042")).journals[0]
            spec = replace(listed.spec, labels=LabelSet([("touched", "yes")]))
            applied = await client.apply([SpecChange(spec.name, listed.mod_revision, spec)])
        await server.keyspace.wait_for_revision(applied.revision, timeout=10)
        await eventually(lambda: server.broker.replicas["many/j042"].spec == spec,
                         "the replica has the new spec")
        assert set(resolved) == {"many/j042"}


# -- 13. start-up while etcd is not there yet ---------------------------------------------


async def test_a_broker_started_before_etcd_waits_for_it(tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    """Brokers started right after etcd's port opened exited at once; on Kubernetes they
    start together. The broker retries, saying what it waits for, until etcd answers."""
    port = free_port()
    etcd = EmbeddedEtcd(tmp_path / "etcd", port)
    server = BrokerServer(broker_config(etcd.endpoint, "/late", tmp_path))
    starting = asyncio.create_task(server.start())
    try:
        await eventually(lambda: any("waiting for etcd" in r.getMessage()
                                     for r in caplog.records), "it says it waits", 15)
        assert not starting.done()
        await asyncio.to_thread(etcd.start)
        await asyncio.wait_for(starting, 30)
        await server.apply_yaml(spec_yaml("late/journal"))
    finally:
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await server.stop()
        await asyncio.to_thread(etcd.stop)


# -- 19. specs that silently did the wrong thing ----------------------------------------


async def test_write_only_journals_refuse_reads_and_odd_specs_warn(
    etcd_server: EmbeddedEtcd, etcd_prefix: str, tmp_path: Path,
) -> None:
    async with broker(etcd_server, etcd_prefix, tmp_path) as server, \
            JournalClient(server.grpc_address) as client:
        spec = JournalSpec.from_dict({"name": "odd/write-only", "replication": 3,
                                      "flags": ["O_WRONLY"]})
        applied = await client.apply([SpecChange(spec.name, 0, spec)])
        assert applied.warnings == (
            "odd/write-only: replication 3 is more than the 1 broker(s) of the cluster: "
            "its appends are refused (INSUFFICIENT_JOURNAL_BROKERS) until there are 3",
            "odd/write-only: no fragment stores: its content is never persisted, and is "
            "lost when its brokers stop (set fragment.stores)")
        await server.apply_yaml(spec_yaml("odd/wo") .replace(
            '"replication": 1', '"replication": 1, "flags": ["O_WRONLY"]'))
        await client.append("odd/wo", b"in\n")
        with pytest.raises(BrokerError) as err:
            async for _ in client.read("odd/wo"):
                pass
        assert err.value.status == "NOT_ALLOWED"
        async with aiohttp.ClientSession() as http, \
                http.get(f"{server.http_url}/odd/wo") as r:
            assert r.status == 403 and "write-only" in await r.text()


# -- 21. messages that say what is true ---------------------------------------------------


async def test_a_lost_spool_of_a_replication_one_journal_is_said_lost(
    etcd_server: EmbeddedEtcd, etcd_prefix: str, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """After a crash, a replication-1 journal's leftover spool was reported as held by
    other replicas; its content is lost, and the broker says so, naming the journal."""
    async with broker(etcd_server, etcd_prefix, tmp_path / "first") as server:
        await server.apply_yaml(spec_yaml("lost/alone"))
    folder = tmp_path / "spools" / "lost%2Falone"
    folder.mkdir(parents=True)
    (folder / "spool-crashed").write_bytes(b"never persisted\n")
    async with broker(etcd_server, etcd_prefix, tmp_path, spool_dir=tmp_path / "spools"):
        pass
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "lost/alone" in text and "replication 1" in text and "lost" in text
    assert "held by other replicas" not in text
