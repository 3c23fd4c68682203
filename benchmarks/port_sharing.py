"""Would serving HTTP and gRPC on one port cost gRPC throughput? Measured.

grpc.aio owns its listening socket, so one port for both would need a relay in front of
it, in the broker process: accept on the public port, peek at the first bytes, and splice
connections that open with the HTTP/2 preface (``PRI * HTTP/2.0``) to the gRPC server's
private port, anything else to the aiohttp gateway. This script runs that relay, as
cheap as asyncio makes it (buffered-protocol callbacks: the transport reads into the
relay's buffer, which goes to the other side's transport as a view, with flow control;
no streams, no copies in Python), on the event loop of a real broker (`BrokerServer`,
etcd embedded) in a process of its own, as it would run in ``gazette serve``. A client
in this process streams 1 MiB Append messages (64 MiB an RPC, one RPC at a time) to a
journal of codec NONE, straight to the gRPC port and through the relay; the shared port
also answers the gateway's ``/healthz``, and every commit's SHA-1 is checked.

The rounds are short and alternate (direct, relay, relay, direct, ...), so whatever
else the machine is doing slows both paths alike; the figures are over all rounds of a
path (bytes / seconds), so the ratio compares like with like even on a busy machine,
though the absolute figures then are lower. Prints progress (per round: MB/s and the
broker process's CPU seconds per GB; then the best round and the median of the per-pair
ratios) to stderr, then one JSON line: ``grpc_direct_mb_per_s``,
``grpc_via_relay_mb_per_s``, ``relay_cost_ratio`` (the fraction of direct throughput
the relay costs, ``1 - via_relay / direct``: 0 is free, 0.25 a quarter lost), and
``broker_cpu_s_per_gb_direct`` / ``_via_relay`` (the broker process's CPU seconds per GB
streamed each way: the relay's own cost, which other processes disturb less).

Run with ``GLIBC_TUNABLES`` as the Makefile sets it (the broker process gets it anyway).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import aiohttp
import grpc
import uvloop
from bench_broker import TUNABLES  # type: ignore[import-not-found]

from gazette.local import EmbeddedEtcd
from gazette.pb import broker_pb2 as pb
from gazette.pb import broker_pb2_grpc

MiB = 1 << 20
#: Bytes streamed in each round, in 1 MiB messages, 64 of them an Append RPC.
VOLUME = 128 * MiB
RPC_MESSAGES = 64
ROUNDS = 12
JOURNAL = "bench/port-sharing"
SPEC = f"""
name: {JOURNAL}
replication: 1
fragment: {{length: 268435456, compression_codec: NONE, flush_interval: 0s,
            refresh_interval: 1h}}
"""
#: The HTTP/2 client connection preface: a gRPC client's first bytes.
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#: Bytes a relay side buffers for its peer before it stops reading from the other.
HIGH_WATER = 4 * MiB
#: Bytes a relay side reads at once (at most).
READ_BUFFER = 1 * MiB


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the relay (runs in the broker process) --------------------------------------------


class _Pipe(asyncio.BufferedProtocol):
    """One side of a relayed connection: the transport reads straight into this side's
    buffer, and what it read is handed to `peer`'s transport as a view of that buffer
    (no copy in Python). When the peer's outgoing buffer fills, reading from this side
    pauses."""

    def __init__(self, peer: _Pipe | None = None) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer = peer
        self._view = memoryview(bytearray(READ_BUFFER))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A TCP transport (uvloop's are not `asyncio.Transport` subclasses).
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=HIGH_WATER)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._view

    def buffer_updated(self, nbytes: int) -> None:
        assert self.peer is not None and self.peer.transport is not None
        out = self.peer.transport
        out.write(self._view[:nbytes])
        if out.get_write_buffer_size():
            # Not all sent: the transport keeps the view to send later, so the next
            # read must go to a buffer of its own.
            self._view = memoryview(bytearray(READ_BUFFER))

    def pause_writing(self) -> None:  # our outgoing buffer is full: stop reading the peer
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def eof_received(self) -> bool:
        if self.peer is not None and self.peer.transport is not None \
                and self.peer.transport.can_write_eof():
            self.peer.transport.write_eof()
        return True  # half-closed: the other direction may still flow

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


class _Accepted(_Pipe):
    """A connection to the shared port: its first bytes pick the upstream (gRPC for the
    HTTP/2 preface, else HTTP), then it is a plain `_Pipe`."""

    def __init__(self, grpc_port: int, http_port: int) -> None:
        super().__init__()
        self._ports = (grpc_port, http_port)
        self._head = bytearray()
        self._connecting: asyncio.Task[None] | None = None

    def buffer_updated(self, nbytes: int) -> None:
        if self.peer is not None and self.peer.transport is not None:
            super().buffer_updated(nbytes)
            return
        self._head += self._view[:nbytes]
        if self._connecting is not None:
            return
        n = min(len(self._head), len(H2_PREFACE))
        if self._head[:n] != H2_PREFACE[:n]:
            port = self._ports[1]  # not HTTP/2 (an HTTP/1 request line)
        elif n == len(H2_PREFACE):
            port = self._ports[0]
        else:
            return  # a prefix of the preface so far: wait for more
        assert self.transport is not None
        self.transport.pause_reading()
        self._connecting = asyncio.ensure_future(self._connect(port))

    async def _connect(self, port: int) -> None:
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        try:  # the upstream's peer is set at once: it may receive before we resume
            _, upstream = await loop.create_connection(lambda: _Pipe(self), "127.0.0.1",
                                                       port)
        except OSError:
            self.transport.close()
            return
        self.peer = upstream
        assert upstream.transport is not None
        if self.transport.is_closing():
            upstream.transport.close()
            return
        upstream.transport.write(bytes(self._head))
        self._head.clear()
        self.transport.resume_reading()

    def eof_received(self) -> bool:
        if self.peer is None:
            return False  # closed before it said what it is
        return super().eof_received()


async def serve(etcd_endpoint: str, workdir: Path) -> None:
    """The broker process: a broker (gRPC and HTTP on ports of their own) and the relay
    on a third, shared port; prints the three ports as a JSON line, serves until
    SIGTERM."""
    from gazette_broker.server import BrokerConfig, BrokerServer

    server = BrokerServer(BrokerConfig(
        host="127.0.0.1", bind="127.0.0.1", port=0, http_port=0, spool_dir=workdir / "spools",
        etcd_address=etcd_endpoint, grace=1.0))
    await server.start()
    loop = asyncio.get_running_loop()
    relay = await loop.create_server(lambda: _Accepted(server.grpc_port, server.http_port),
                                     "127.0.0.1", 0)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    try:
        await server.apply_yaml(SPEC)
        print(json.dumps({"grpc_port": server.grpc_port, "http_port": server.http_port,
                          "shared_port": relay.sockets[0].getsockname()[1],
                          "pid": os.getpid()}), flush=True)
        await stop.wait()
    finally:
        relay.close()
        await server.stop()


# -- the client (this process) ---------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (Linux)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def stream(stub: broker_pb2_grpc.JournalStub, volume: int, message: pb.AppendRequest,
                 sha1: bytes) -> float:
    """Seconds taken to append `volume` bytes in 1 MiB messages, one RPC at a time
    (`sha1`: of an RPC's content, which each commit must have)."""

    def requests() -> Iterator[pb.AppendRequest]:
        yield pb.AppendRequest(journal=JOURNAL)
        for _ in range(RPC_MESSAGES):
            yield message
        yield pb.AppendRequest()

    start = time.perf_counter()
    for _ in range(volume // (RPC_MESSAGES * MiB)):
        resp = await stub.Append(requests())  # type: ignore[arg-type]
        assert resp.status == pb.OK, pb.Status.Name(resp.status)
        assert resp.commit.sha1 == sha1, "the broker got other bytes than were sent"
    return time.perf_counter() - start


async def measure(ports: dict[str, int], rounds: int, volume: int
                  ) -> dict[str, tuple[list[float], list[float]]]:
    """Per path, the seconds and the broker's CPU seconds of each round."""
    options = [("grpc.max_send_message_length", 64 * MiB),
               ("grpc.max_receive_message_length", 64 * MiB)]
    message = pb.AppendRequest(content=os.urandom(MiB))
    sha1 = hashlib.sha1(message.content * RPC_MESSAGES).digest()
    pid = ports["pid"]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{ports['grpc_port']}",
                                         options=options) as direct, \
            grpc.aio.insecure_channel(f"127.0.0.1:{ports['shared_port']}",
                                      options=options) as relayed, \
            aiohttp.ClientSession() as http:
        # The shared port answers HTTP too: the gateway's health check through the relay.
        async with http.get(f"http://127.0.0.1:{ports['shared_port']}/healthz") as r:
            assert r.status == 200, r.status
        stubs = {"direct": broker_pb2_grpc.JournalStub(direct),
                 "via relay": broker_pb2_grpc.JournalStub(relayed)}
        for stub in stubs.values():  # connect and warm up both paths
            await stream(stub, RPC_MESSAGES * MiB, message, sha1)
        results: dict[str, tuple[list[float], list[float]]] = {
            name: ([], []) for name in stubs}
        for i in range(rounds):
            order = list(stubs) if i % 2 == 0 else list(reversed(stubs))
            for name in order:
                cpu = _cpu_seconds(pid)
                seconds = await stream(stubs[name], volume, message, sha1)
                cpu = _cpu_seconds(pid) - cpu
                results[name][0].append(seconds)
                results[name][1].append(cpu)
                log(f"round {i + 1}/{rounds} {name:9}: {volume / seconds / 1e6:5.0f} MB/s, "
                    f"broker process {cpu / (volume / 1e9):.2f} CPU s/GB")
        written = (2 * rounds * volume) + 2 * RPC_MESSAGES * MiB
        resp = [r async for r in stubs["direct"].Read(pb.ReadRequest(
            journal=JOURNAL, offset=-1, metadata_only=True, block=False))]
        assert resp[-1].write_head == written, (resp[-1].write_head, written)
    return results


async def run(rounds: int, volume: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="gazette-bench-") as tmp, \
            EmbeddedEtcd(Path(tmp) / "etcd") as etcd:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--serve", etcd.endpoint, tmp,
            stdout=asyncio.subprocess.PIPE, env=dict(os.environ, GLIBC_TUNABLES=TUNABLES))
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            if not line:
                raise RuntimeError("the broker process did not start")
            ports = json.loads(line)
            log(f"broker pid {ports['pid']}: gRPC :{ports['grpc_port']}, HTTP "
                f":{ports['http_port']}, shared (relay) :{ports['shared_port']}; "
                f"{rounds} rounds of {volume // MiB} MiB each way; load average "
                f"{os.getloadavg()[0]:.1f}")
            figures = await measure(ports, rounds, volume)
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            await asyncio.wait_for(proc.wait(), 60)
    (direct_s, direct_cpu), (via_s, via_cpu) = figures["direct"], figures["via relay"]
    gb = rounds * volume / 1e9
    direct, via = gb * 1e3 / sum(direct_s), gb * 1e3 / sum(via_s)
    pairs = [1 - d / v for d, v in zip(direct_s, via_s, strict=True)]
    log(f"best rounds: direct {volume / min(direct_s) / 1e6:.0f} MB/s, via relay "
        f"{volume / min(via_s) / 1e6:.0f} MB/s; median cost of a pair of rounds "
        f"{statistics.median(pairs):.3f}; load average {os.getloadavg()[0]:.1f}")
    return {"grpc_direct_mb_per_s": round(direct), "grpc_via_relay_mb_per_s": round(via),
            "relay_cost_ratio": round(1 - via / direct, 3),
            "broker_cpu_s_per_gb_direct": round(sum(direct_cpu) / gb, 2),
            "broker_cpu_s_per_gb_via_relay": round(sum(via_cpu) / gb, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help=f"rounds each way (default: {ROUNDS})")
    parser.add_argument("--volume-mib", type=int, default=VOLUME // MiB,
                        help=f"MiB streamed a round (default: {VOLUME // MiB}; a multiple "
                             f"of {RPC_MESSAGES})")
    parser.add_argument("--serve", nargs=2, metavar=("ETCD", "WORKDIR"),
                        help=argparse.SUPPRESS)  # the broker process
    args = parser.parse_args()
    if args.serve:
        uvloop.run(serve(args.serve[0], Path(args.serve[1])))
        return
    if args.volume_mib <= 0 or args.volume_mib % RPC_MESSAGES or args.rounds < 1:
        parser.error(f"--volume-mib must be a positive multiple of {RPC_MESSAGES}, "
                     "--rounds at least 1")
    print(json.dumps(uvloop.run(run(args.rounds, args.volume_mib * MiB))))


if __name__ == "__main__":
    main()
