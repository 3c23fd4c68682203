"""Broker throughput and latency: etcd and one `gazette serve` process on this machine,
clients in this process.

Prints progress, then one JSON object as its last line:

- ``append_mb_per_s``: 64 KiB appends to one journal (codec NONE) from this process,
  through the client's `AppendQueue` (which packs queued appends into large Append RPCs,
  each append still atomic and acknowledged on its own);
- ``append_rpc_mb_per_s``: the same appends as one Append RPC each (32 in flight), for
  comparison;
- ``append_small_p50_ms`` / ``append_small_p99_ms``: 1 KiB appends, one RPC each, sent at
  a fixed 1,000/s (latency from the intended send time, so stalls count), the medians of
  three runs of 5 s;
- ``read_tail_mb_per_s``: a blocking reader following the write head of a journal that
  another process keeps appending to (4 MiB appends, four in flight), starting 256 MiB
  behind the head: its MB/s until it reaches the head (``read_tail_writer_mb_per_s``:
  the writer's meanwhile; ``read_tail_in_step_mb_per_s``: the reader's once it is
  caught up, which is the writer's pace); each the median of five runs;
- ``read_fragments_mb_per_s``: reading persisted ``file://`` fragments through the
  client's direct fragment reads (``direct=True``: the broker names a signed URL, the
  client reads and verifies the file); ``read_fragments_via_broker_mb_per_s``: the same
  bytes streamed by the broker;
- ``raw_file_write_mb_per_s`` / ``raw_file_read_mb_per_s``: writing and reading the same
  volume with plain file I/O, the ceiling of this machine's disk path;
- ``append_mb_per_s_tls``: the same 64 KiB appends (`AppendQueue`) to a second broker
  serving TLS (a certificate made by `trustme`) with authorization on (every call
  carries a bearer token), in rounds alternating with the plain broker
  (``append_mb_per_s_plain``, the same run's plain figure); ``tls_cost`` is
  1 - tls / plain (target: at most 0.15);
- ``append_r3_mb_per_s``: a cluster of three more brokers (two zones) on this machine,
  64 KiB appends (`AppendQueue`) to a journal of replication 3, sent to its primary;
  ``append_r3_via_peer_mb_per_s``: the same sent to another broker, which forwards them;
  ``append_r3_routed_mb_per_s``: sent to that broker by a client with
  ``route_appends=True``, which then goes to the primary itself;
- ``failover_s``: from SIGKILL of a journal's primary (replication 2 of the three) to
  the next acknowledged append of a writer appending all along through another broker;
  ``lease_ttl_s``: the brokers' lease TTL (their default), which bounds it;
- part ``scale`` (`scale_bench.py`, last, with the lone broker stopped): what the number
  of journals costs a cluster. ``converge_s_2000_journals``: three brokers, 2,000
  journals of replication 3 applied by one ``gazctl journals apply`` process, seconds
  until every journal took an append (null after 300 s, with
  ``converge_refused_2000_journals``); ``idle_cpu_2000_journals``: then the largest
  broker CPU share over 10 s idle (``_each``: all three); ``sync_ms_per_event_10k_journals``:
  three brokers, 10,000 journals of replication 1, the broker CPU ms one single spec
  change costs beyond idle, the largest of the three (``_each``: all three); and
  ``scale_phases_s``, how long each step took. See that module's docstring.

Stops its processes (brokers, etcd) on the way out, on Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The benchmark spawns the broker and a writer from a process with live gRPC threads;
# grpcio's fork handlers only get in the way of that (see tests/conftest.py).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import grpc
import uvloop
from bench_broker import TUNABLES  # type: ignore[import-not-found]
from scale_bench import bench_scale, run_with_etcd  # type: ignore[import-not-found]

from gazette.allocator import assignments_of, route_of
from gazette.client import AppendQueue, JournalClient, RetryPolicy
from gazette.cluster import DEFAULT_LEASE_TTL
from gazette.keyspace import Decoder, Etcd, KeySpace, Layout, apply_changes
from gazette.local import free_port
from gazette.pb import broker_pb2 as pb
from gazette.pb import broker_pb2_grpc
from gazette.protocol import journal_changes_from_yaml

MiB = 1 << 20
APPEND_VOLUME = 512 * MiB
SMALL_RATE, SMALL_SECONDS, SMALL_RUNS = 1000, 5, 3
TAIL_BACKLOG, TAIL_STEP_SECONDS, TAIL_RUNS = 256 * MiB, 2.0, 5
FRAGMENT_VOLUME = 256 * MiB

#: 64 MiB uncompressed fragments in the file store, rolled only by length.
FRAGMENT_YAML = """fragment:
  length: 67108864
  compression_codec: NONE
  stores: ["file:///"]
  flush_interval: 1h
  refresh_interval: 1h"""

SPECS = f"""
name: bench/
replication: 1
{FRAGMENT_YAML}
children:
  - name: bench/append
  - name: bench/append-rpc
  - name: bench/append-tls
  - name: bench/small
  - name: bench/tail-0
    fragment: {{length: 1073741824}}
  - name: bench/tail-1
    fragment: {{length: 1073741824}}
  - name: bench/tail-2
    fragment: {{length: 1073741824}}
  - name: bench/tail-3
    fragment: {{length: 1073741824}}
  - name: bench/tail-4
    fragment: {{length: 1073741824}}
  - name: bench/fragments
"""


CLUSTER_PREFIX = "/gazette/bench-cluster"
CLUSTER_VOLUME = 1024 * MiB
CLUSTER_SPECS = f"""
name: cluster/
replication: 3
{FRAGMENT_YAML}
children:
  - name: cluster/r3
  - name: cluster/failover
    replication: 2
"""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def raw_file_io(folder: Path, volume: int) -> tuple[float, float]:
    """MB/s of writing `volume` bytes to a new file in 1 MiB writes (no fsync: the broker
    does not fsync spools either), then of reading it back."""
    data = os.urandom(MiB)
    path = folder / "raw.bin"
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(volume // MiB):
            os.write(fd, data)
    finally:
        os.close(fd)
    write = volume / (time.perf_counter() - start) / 1e6
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as fh:
        while fh.read(MiB):
            pass
    read = volume / (time.perf_counter() - start) / 1e6
    path.unlink()
    return write, read


async def bench_append_queue(client: JournalClient, journal: str = "bench/append",
                             volume: int = APPEND_VOLUME) -> float:
    queue = AppendQueue(client)
    chunk = os.urandom(64 << 10)
    n = volume // len(chunk)
    start = time.perf_counter()
    futures = []
    for _ in range(n):
        futures.append(queue.append(journal, chunk))
        if len(futures) % 256 == 0:
            await queue.wait_for_room()
    await asyncio.gather(*futures)
    elapsed = time.perf_counter() - start
    await queue.close()
    return n * len(chunk) / elapsed / 1e6


TLS_ROUNDS = 3
TLS_PREFIX = "/gazette/bench-tls"


async def bench_tls(plain: JournalClient, etcd_endpoint: str, workdir: Path,
                    env: dict[str, str]) -> dict[str, object]:
    """64 KiB appends to a TLS + token broker and to the plain one, alternating."""
    import base64

    import trustme

    from gazette.auth import Capability, ClientAuth, SigningKeys, TLSFiles

    folder = workdir / "tls"
    folder.mkdir()
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_and_cert_chain_pem.write_to_path(str(folder / "broker.pem"))
    key = os.urandom(32)
    (folder / "keys").write_text(base64.b64encode(key).decode())
    grpc_port = free_port()
    broker = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gazette_broker", "serve", "--broker.port", str(grpc_port),
        "--broker.http-port", "-1", "--broker.host", "127.0.0.1",
        "--broker.file-root", str(workdir / "store-tls"), "--broker.spool-dir",
        str(workdir / "spools-tls"), "--etcd.address", etcd_endpoint,
        "--etcd.prefix", TLS_PREFIX, "--log.level", "warn",
        "--tls.cert-file", str(folder / "broker.pem"),
        "--tls.key-file", str(folder / "broker.pem"),
        "--tls.ca-file", str(folder / "ca.pem"), "--auth.keys-file", str(folder / "keys"),
        env=env)
    try:
        async with Etcd(etcd_endpoint) as etcd:
            await apply_changes(etcd, Layout(TLS_PREFIX), journal_changes_from_yaml(SPECS))
        token = SigningKeys([key]).issue("bench", {Capability.APPEND, Capability.LIST,
                                                   Capability.READ}, ttl=3600)
        auth = ClientAuth(TLSFiles(ca_file=str(folder / "ca.pem")), token)
        async with JournalClient(f"127.0.0.1:{grpc_port}", auth=auth) as client:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if len((await client.list("prefix=bench/")).journals) == 10 and (
                            await client.write_head("bench/append-tls")) == 0:
                        break
                except Exception:  # noqa: BLE001 - the broker is still starting
                    pass
                assert time.monotonic() < deadline, "the TLS broker did not start"
                await asyncio.sleep(0.1)
            tls_runs, plain_runs = [], []
            for _ in range(TLS_ROUNDS):
                plain_runs.append(await bench_append_queue(plain, "bench/append-tls"))
                tls_runs.append(await bench_append_queue(client, "bench/append-tls"))
        tls_mb, plain_mb = statistics.median(tls_runs), statistics.median(plain_runs)
        log("TLS + token rounds (MB/s): " + ", ".join(f"{x:.0f}" for x in tls_runs) +
            "; plain: " + ", ".join(f"{x:.0f}" for x in plain_runs))
        log(f"append over TLS with tokens {tls_mb:.0f} MB/s against {plain_mb:.0f} plain "
            f"(cost {1 - tls_mb / plain_mb:.1%})")
        return {"append_mb_per_s_tls": round(tls_mb), "append_mb_per_s_plain": round(plain_mb),
                "tls_cost": round(1 - tls_mb / plain_mb, 3)}
    finally:
        broker.terminate()
        await asyncio.wait_for(broker.wait(), 60)


async def bench_append_rpcs(stub: broker_pb2_grpc.JournalStub) -> float:
    chunk = os.urandom(64 << 10)
    n, inflight = 4000, 32
    sem = asyncio.Semaphore(inflight)

    async def one() -> None:
        async with sem:
            resp = await stub.Append(iter([pb.AppendRequest(journal="bench/append-rpc"),
                                           pb.AppendRequest(content=chunk),
                                           pb.AppendRequest()]))
            assert resp.status == pb.OK

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return n * len(chunk) / (time.perf_counter() - start) / 1e6


async def bench_small(client: JournalClient) -> tuple[float, float]:
    """Latency of 1 KiB appends sent on a fixed schedule, measured from the time each
    was due (perf_counter: uvloop's clock only has millisecond resolution)."""
    data = b"x" * 1023 + b"\n"
    latencies: list[float] = []
    tasks: set[asyncio.Task[None]] = set()

    async def one(due: float) -> None:
        await client.append("bench/small", data)
        latencies.append(time.perf_counter() - due)

    start = time.perf_counter()
    for i in range(SMALL_RATE * SMALL_SECONDS):
        due = start + i / SMALL_RATE
        wait = due - time.perf_counter()
        if wait > 0.0005:
            await asyncio.sleep(wait)
        task = asyncio.create_task(one(due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
    latencies.sort()
    p50 = statistics.median(latencies) * 1e3
    p99 = latencies[int(len(latencies) * 0.99) - 1] * 1e3
    return p50, p99


async def tail_writer(address: str, journal: str) -> None:
    """Append 4 MiB appends to `journal`, four in flight, until killed (the writer of the
    tail benchmark, in a process of its own so that it and the reader each have a
    client's loop)."""
    data = os.urandom(4 * MiB)
    async with JournalClient(address) as client:
        sem = asyncio.Semaphore(4)

        async def one() -> None:
            try:
                await client.append(journal, data)
            finally:
                sem.release()

        tasks: set[asyncio.Task[None]] = set()
        while True:
            await sem.acquire()
            task = asyncio.create_task(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)


async def bench_tail(client: JournalClient, address: str, journal: str
                     ) -> tuple[float, float, float]:
    """A reader following the head of a journal while another process appends to it.

    The reader starts TAIL_BACKLOG behind the head and reads until it reaches it: its
    MB/s is what a tailing reader gets from the broker (spool content, in the page
    cache) while the broker also takes the appends, rather than the writer's pace. Also
    returns the writer's MB/s meanwhile and, once caught up, the reader's MB/s in step
    with the writer."""
    writer = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--tail-writer", address, journal,
        env=dict(os.environ, GLIBC_TUNABLES=TUNABLES))
    try:
        deadline = time.monotonic() + 60
        while (await client.write_head(journal)) < TAIL_BACKLOG:
            assert writer.returncode is None, "the tail writer exited"
            assert time.monotonic() < deadline, "the tail writer is too slow"
            await asyncio.sleep(0.05)
        got, start, head0 = 0, time.perf_counter(), await client.write_head(journal)
        caught_up_at, caught_up_bytes, head1, step_bytes = 0.0, 0, 0, 0
        async with asyncio.timeout(120), \
                contextlib.aclosing(client.read(journal, 0, block=True)) as chunks:
            async for chunk in chunks:
                got += len(chunk.content)
                if not caught_up_at and chunk.end >= chunk.write_head:
                    caught_up_at, head1 = time.perf_counter(), chunk.write_head
                    caught_up_bytes = got
                elif caught_up_at:
                    step_bytes = got - caught_up_bytes
                    if time.perf_counter() - caught_up_at >= TAIL_STEP_SECONDS:
                        break
        step_s = time.perf_counter() - caught_up_at
    finally:
        writer.kill()
        await writer.wait()
    catch_up_s = caught_up_at - start
    return (caught_up_bytes / catch_up_s / 1e6, (head1 - head0) / catch_up_s / 1e6,
            step_bytes / step_s / 1e6)


async def bench_fragments(client: JournalClient, stub: broker_pb2_grpc.JournalStub,
                          ) -> tuple[float, float]:
    data = os.urandom(MiB)

    def requests() -> object:
        yield pb.AppendRequest(journal="bench/fragments")
        for _ in range(64):
            yield pb.AppendRequest(content=data)
        yield pb.AppendRequest()

    for _ in range(FRAGMENT_VOLUME // (64 * MiB)):
        assert (await stub.Append(requests())).status == pb.OK  # type: ignore[arg-type]
    # Roll the last fragment: rolls happen before an append that finds the spool full.
    assert (await stub.Append(iter([pb.AppendRequest(journal="bench/fragments"),
                                    pb.AppendRequest(content=b"."),
                                    pb.AppendRequest()]))).status == pb.OK
    deadline = time.monotonic() + 60
    while True:  # until the persisted fragments cover the volume
        frags = await client.list_fragments("bench/fragments")
        persisted = [f for f in frags if f.fragment.backing_store]
        if persisted and persisted[-1].fragment.end >= FRAGMENT_VOLUME:
            break
        assert time.monotonic() < deadline, "fragments were not persisted in time"
        await asyncio.sleep(0.1)

    async def read(direct: bool) -> float:
        got = 0
        start = time.perf_counter()
        async for chunk in client.read("bench/fragments", 0, end_offset=FRAGMENT_VOLUME,
                                       direct=direct):
            got += len(chunk.content)
        assert got == FRAGMENT_VOLUME, got
        return got / (time.perf_counter() - start) / 1e6

    await read(True)  # warm the page cache of the fragment files
    return await read(True), await read(False)


async def run(etcd_endpoint: str, workdir: Path, only: set[str]) -> dict[str, object]:
    """The figures of the parts in `only`: the lone broker's and the cluster's, then the
    scale part's (with no other broker running). SIGTERM cancels it like Ctrl-C does, so
    every process it started is stopped."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    result: dict[str, object] = {}
    if only - {"scale"}:
        result.update(await run_broker(etcd_endpoint, workdir, only))
    if "scale" in only:
        await asyncio.to_thread(os.sync)
        result.update(await bench_scale(etcd_endpoint, workdir))
    return result


async def run_broker(etcd_endpoint: str, workdir: Path, only: set[str]
                     ) -> dict[str, object]:
    grpc_port, http_port = free_port(), free_port()
    env = dict(os.environ, GLIBC_TUNABLES=TUNABLES)
    broker = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gazette_broker", "serve", "--broker.port", str(grpc_port),
        "--broker.http-port", str(http_port), "--broker.host", "127.0.0.1",
        "--broker.file-root", str(workdir / "store"), "--broker.spool-dir",
        str(workdir / "spools"), "--etcd.address", etcd_endpoint, "--log.level", "warn",
        env=env)
    try:
        async with Etcd(etcd_endpoint) as etcd:
            await apply_changes(etcd, Layout.brokers(), journal_changes_from_yaml(SPECS))
        address = f"127.0.0.1:{grpc_port}"
        async with JournalClient(address) as client, \
                grpc.aio.insecure_channel(address, options=[
                    ("grpc.max_send_message_length", 64 * MiB),
                    ("grpc.max_receive_message_length", 64 * MiB)]) as channel:
            stub = broker_pb2_grpc.JournalStub(channel)
            deadline = time.monotonic() + 30
            while True:  # until the broker serves the journals
                try:
                    listing = await client.list("prefix=bench/")
                    if len(listing.journals) == 10 and (await client.write_head(
                            "bench/fragments")) == 0:
                        break
                except Exception:  # noqa: BLE001 - the broker is still starting
                    pass
                assert time.monotonic() < deadline, "the broker did not start"
                await asyncio.sleep(0.1)

            log(f"broker pid {broker.pid}")
            raw_write = raw_read = append = append_rpc = p50 = p99 = tail = direct = \
                via_broker = tail_write = tail_step = 0.0
            tls_figures: dict[str, object] = {}
            if "raw" in only:
                raw_write, raw_read = await asyncio.to_thread(raw_file_io, workdir,
                                                              APPEND_VOLUME)
                log(f"raw file write {raw_write:.0f} MB/s, read {raw_read:.0f} MB/s")
            if "append" in only:
                append = await bench_append_queue(client)
                log(f"append (AppendQueue, 64 KiB) {append:.0f} MB/s")
                append_rpc = await bench_append_rpcs(stub)
                log(f"append (one RPC per 64 KiB, 32 in flight) {append_rpc:.0f} MB/s")
            if "small" in only:
                # Earlier parts left ~1 GB of dirty pages: write them back first, so the
                # latency is not measured against the kernel's writeback of other parts.
                await asyncio.to_thread(os.sync)
                small = [await bench_small(client) for _ in range(SMALL_RUNS)]
                p50, p99 = (statistics.median(figures) for figures in zip(*small, strict=True))
                log("1 KiB append runs (p50, p99 ms): " +
                    "; ".join(f"{a:.2f}, {b:.2f}" for a, b in small))
                log(f"1 KiB appends at {SMALL_RATE}/s: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
            if "tail" in only:
                await asyncio.to_thread(os.sync)
                runs = [await bench_tail(client, address, f"bench/tail-{i}")
                        for i in range(TAIL_RUNS)]  # the median of each figure
                tail, tail_write, tail_step = (statistics.median(figures)
                                               for figures in zip(*runs, strict=True))
                log("tail runs (read, write, in step): " +
                    "; ".join(", ".join(f"{x:.0f}" for x in r) for r in runs))
                log(f"tail read (catching up from {TAIL_BACKLOG // MiB} MiB behind) "
                    f"{tail:.0f} MB/s while the writer appended {tail_write:.0f} MB/s; "
                    f"in step with the writer {tail_step:.0f} MB/s")
            if "tls" in only:
                tls_figures = await bench_tls(client, etcd_endpoint, workdir, env)
            if "fragments" in only:
                direct, via_broker = await bench_fragments(client, stub)
                log(f"fragment reads: direct {direct:.0f} MB/s, via the broker "
                    f"{via_broker:.0f} MB/s")
        r3 = r3_via_peer = r3_routed = failover = 0.0
        if "cluster" in only:
            await asyncio.to_thread(os.sync)
            r3, r3_via_peer, r3_routed, failover = await bench_cluster(etcd_endpoint,
                                                                       workdir)
            log(f"replication 3 over three brokers: {r3:.0f} MB/s to the primary, "
                f"{r3_via_peer:.0f} MB/s through a peer, {r3_routed:.0f} MB/s routed by "
                f"the client; failover {failover:.2f} s (lease TTL {DEFAULT_LEASE_TTL} s)")
    finally:
        broker.terminate()
        await asyncio.wait_for(broker.wait(), 60)
    return {
        **tls_figures,
        "append_mb_per_s": round(append),
        "append_rpc_mb_per_s": round(append_rpc),
        "append_small_p50_ms": round(p50, 2),
        "append_small_p99_ms": round(p99, 2),
        "read_tail_mb_per_s": round(tail),
        "read_tail_writer_mb_per_s": round(tail_write),
        "read_tail_in_step_mb_per_s": round(tail_step),
        "read_fragments_mb_per_s": round(direct),
        "read_fragments_via_broker_mb_per_s": round(via_broker),
        "raw_file_write_mb_per_s": round(raw_write),
        "raw_file_read_mb_per_s": round(raw_read),
        "append_vs_raw_write": round(append / raw_write, 3) if raw_write else None,
        "read_fragments_vs_raw_write": round(direct / raw_write, 3) if raw_write else None,
        "append_r3_mb_per_s": round(r3),
        "append_r3_via_peer_mb_per_s": round(r3_via_peer),
        "append_r3_routed_mb_per_s": round(r3_routed),
        "failover_s": round(failover, 2),
        "lease_ttl_s": DEFAULT_LEASE_TTL,
    }


def cluster_broker_args(etcd_endpoint: str, workdir: Path, i: int, port: int,
                        prefix: str = CLUSTER_PREFIX) -> list[str]:
    """The command line of broker `i` of a bench cluster (zones a, a, b), at the
    defaults otherwise."""
    zone = ["zone-a", "zone-a", "zone-b"][i % 3]
    return [sys.executable, "-m", "gazette_broker", "serve", "--broker.port", str(port),
            "--broker.http-port", "-1", "--broker.host", "127.0.0.1", "--broker.zone", zone,
            "--broker.id", f"bench-{i}", "--broker.file-root", str(workdir / "store"),
            "--broker.spool-dir", str(workdir / f"cluster-spools-{i}"), "--etcd.address",
            etcd_endpoint, "--etcd.prefix", prefix, "--log.level", "warn"]


async def start_cluster(etcd_endpoint: str, workdir: Path, prefix: str = CLUSTER_PREFIX
                        ) -> dict[str, asyncio.subprocess.Process]:
    """Three brokers (zones a, a, b) under their own etcd prefix: address -> process."""
    env = dict(os.environ, GLIBC_TUNABLES=TUNABLES)
    procs = {}
    for i in range(3):
        port = free_port()
        procs[f"127.0.0.1:{port}"] = await asyncio.create_subprocess_exec(
            *cluster_broker_args(etcd_endpoint, workdir, i, port, prefix), env=env)
    return procs


def consistent_route(keyspace: KeySpace[Any], layout: Layout, journal: str, members: int
                     ) -> tuple[str, list[str]] | None:
    """(primary address, the others' addresses) once `journal` has `members` assignments
    that all acknowledged its route; None until then."""
    assigned = assignments_of(keyspace, layout, journal)
    r = route_of(assigned)
    if len(assigned) != members or r.primary < 0 or \
            any(a.value != r.encode() for a in assigned):
        return None
    addresses = []
    for m in r.members:
        entry = keyspace.get(layout.member_key(m.zone, m.suffix))
        if entry is None:
            return None
        addresses.append(entry.value.endpoint.removeprefix("http://"))
    return addresses[r.primary], [a for i, a in enumerate(addresses) if i != r.primary]


async def bench_cluster(etcd_endpoint: str, workdir: Path
                        ) -> tuple[float, float, float, float]:
    """(append_r3_mb_per_s, append_r3_via_peer_mb_per_s, append_r3_routed_mb_per_s,
    failover_s)."""
    procs = await start_cluster(etcd_endpoint, workdir)
    layout = Layout(CLUSTER_PREFIX)
    try:
        async with Etcd(etcd_endpoint) as etcd, \
                KeySpace(etcd, layout.root + "/", Decoder(layout)) as keyspace:

            def route(journal: str, members: int) -> tuple[str, list[str]] | None:
                return consistent_route(keyspace, layout, journal, members)

            deadline = time.monotonic() + 60
            while len(keyspace.prefixed(layout.members)) < 3:
                assert time.monotonic() < deadline, "the cluster did not start"
                await asyncio.sleep(0.1)
            await apply_changes(etcd, layout, journal_changes_from_yaml(CLUSTER_SPECS))
            while (r3 := route("cluster/r3", 3)) is None or \
                    (fo := route("cluster/failover", 2)) is None:
                assert time.monotonic() < deadline, "the journals were not assigned"
                await asyncio.sleep(0.1)
            figures = []
            # To the primary; through a peer that forwards; through a peer, with a client
            # that learns the primary from the first answer and goes there.
            for address, routed in ((r3[0], False), (r3[1][0], False), (r3[1][0], True)):
                async with JournalClient(address, route_appends=routed) as client:
                    figures.append(await bench_append_queue(client, "cluster/r3",
                                                            CLUSTER_VOLUME))
            failover = await bench_failover(procs, fo[0])
    finally:
        for proc in procs.values():
            if proc.returncode is None:
                proc.terminate()
        await asyncio.gather(*(asyncio.wait_for(p.wait(), 60) for p in procs.values()))
    return figures[0], figures[1], figures[2], failover


async def bench_failover(procs: dict[str, asyncio.subprocess.Process],
                         primary: str) -> float:
    """Seconds from SIGKILL of the failover journal's `primary` to the next append a
    writer (through a broker that stays) gets acknowledged."""
    through = next(a for a in procs if a != primary)
    return await failover_seconds(through, "cluster/failover", procs[primary].kill)


async def failover_seconds(through: str, journal: str, kill: Callable[[], None],
                           watch: Callable[[float], None] | None = None) -> float:
    """Seconds from `kill()` (of `journal`'s primary) to the next append acknowledged
    to a writer appending all along through the broker at `through`. `watch(seconds
    since the kill)` is called every 20 ms meanwhile."""
    acked_at: list[float] = []
    acked = asyncio.Event()
    stop = asyncio.Event()

    async def write() -> None:
        retry = RetryPolicy(attempts=1000, initial_delay=0.05, max_delay=0.1)
        async with JournalClient(through, retry=retry) as client:
            while not stop.is_set():
                with contextlib.suppress(Exception):  # uncertain: keep appending
                    await client.append(journal, b"tick\n")
                    acked_at.append(time.monotonic())
                    acked.set()

    writer = asyncio.create_task(write())
    try:
        async with asyncio.timeout(120):
            while len(acked_at) < 50:
                acked.clear()
                await acked.wait()
            killed_at = time.monotonic()
            kill()
            while acked_at[-1] <= killed_at:
                acked.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(acked.wait(), 0.02)
                if watch is not None:
                    watch(time.monotonic() - killed_at)
        return next(t for t in acked_at if t > killed_at) - killed_at
    finally:
        stop.set()
        await writer


PARTS = ("raw", "append", "small", "tail", "tls", "fragments", "cluster", "scale")


def main() -> None:
    if sys.argv[1:2] == ["--tail-writer"]:
        uvloop.run(tail_writer(*sys.argv[2:4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(PARTS),
                        help=f"comma-separated parts to run (default: all of {PARTS})")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temp dir (broker logs of the scale part, etcd's "
                        "data) and print where it is")
    args = parser.parse_args()
    only = set(args.only.split(","))
    if not only <= set(PARTS):
        parser.error(f"--only: unknown parts {sorted(only - set(PARTS))}")
    run_with_etcd("gazette-bench-", args.keep,
                  lambda endpoint, tmp: run(endpoint, tmp, only))


if __name__ == "__main__":
    main()
