"""The floor of each part of a broker's append path, in CPU seconds per GB appended.

`peers.py` reports the broker's whole CPU per GB (``ours_server_cpu_s_per_gb``); this
script measures, on this machine and in one run, what each part of that work costs at
the least, done alone and as cheaply as Python allows:

- ``grpc_receive_cpu_s_per_gb``: a grpc.aio server (uvloop, in a process of its own)
  receiving Append-like streams (four 1 MiB messages and an empty commit per RPC, two
  RPCs in flight, the client's messages pre-serialized) with a handler that touches
  nothing: gRPC's HTTP/2 framing, its copies and the per-message Python work it costs;
- ``tcp_receive_cpu_s_per_gb``: the same bytes over a plain uvloop TCP connection into
  an asyncio Protocol that counts them: what a transport other than gRPC would cost;
- ``sha1_cpu_s_per_gb``: one SHA-1 pass (a broker makes two: the append's own sum and
  its fragment's running sum);
- ``spool_write_cpu_s_per_gb``: ``os.pwrite`` of 1 MiB chunks into a file (page cache);
- ``persist_cpu_s_per_gb``: putting a closed 1 GiB spool into a ``file://`` store
  on the same file system: a hard link and an fsync (the dirty pages written back);
  ``persist_copy_cpu_s_per_gb``: the same into a store on another file system, a
  ``copy_file_range`` and an fsync;
- ``grpc_unary_p50_ms`` / ``grpc_unary_p99_ms``: 1 KiB unary calls to that gRPC server
  (a handler that answers at once), one at a time, 2,000 of them: the round trip a
  small append cannot go below over grpc.aio; ``tcp_echo_p50_ms`` / ``tcp_echo_p99_ms``:
  the same over plain TCP (an asyncio Protocol echoing one byte).

Each figure is CPU time (user + system) of the process doing the work, the median of
three runs. Prints one JSON object as its last line.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import uvloop

from gazette.local import free_port

MiB = 1 << 20
GB = 1e9
VOLUME = 1024 * MiB
RUNS = 3
METHOD = "/floors.Sink/Append"


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of process `pid`."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the servers (run as `broker_floors.py --serve grpc|tcp PORT`) ----------------------

async def serve_grpc(port: int) -> None:
    async def append(requests: object, context: object) -> bytes:
        async for _ in requests:  # type: ignore[attr-defined]
            pass
        return b""

    async def whole(request: bytes, context: object) -> bytes:
        return b"ok"

    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 * MiB)])
    handlers = {"Append": grpc.stream_unary_rpc_method_handler(append),  # raw bytes
                "Whole": grpc.unary_unary_rpc_method_handler(whole)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "floors.Sink", handlers),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


class _Counter(asyncio.Protocol):
    def __init__(self) -> None:
        self.got = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if len(data) == 1024 and self.got == 0:  # a latency probe: answer it
            assert self.transport is not None
            self.transport.write(b"k")
            return
        self.got += len(data)
        if self.got >= VOLUME and self.transport is not None:
            self.transport.write(b"k")
            self.got -= VOLUME


async def serve_tcp(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Counter, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


# -- the clients ------------------------------------------------------------------------

async def wait_for_port(port: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the floor server on port {port} did not start") from None
            await asyncio.sleep(0.05)


async def server_cpu_per_gb(kind: str, send: Callable[[int], object]) -> float:
    """Start a `kind` server, run `send(port)` (a coroutine function sending VOLUME
    bytes) once to warm up and RUNS more times; the median server CPU s/GB."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(sys.executable, __file__, "--serve", kind,
                                                str(port))
    try:
        await wait_for_port(port)
        await send(port)  # type: ignore[misc]
        figures = []
        for _ in range(RUNS):
            cpu0 = process_cpu(proc.pid)
            await send(port)  # type: ignore[misc]
            figures.append((process_cpu(proc.pid) - cpu0) / (VOLUME / GB))
        return statistics.median(figures)
    finally:
        proc.kill()
        await proc.wait()


async def send_grpc(port: int) -> None:
    content = os.urandom(MiB)
    message = b"\x42" + bytes([0x80, 0x80, 0x40]) + content  # field 8 (content), 1 MiB
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[
            ("grpc.max_send_message_length", 64 * MiB)]) as channel:
        call = channel.stream_unary(METHOD)  # type: ignore[call-arg]  # raw bytes
        sem = asyncio.Semaphore(2)

        async def one() -> None:
            async with sem:
                await call(iter([b"\x0a\x01j", message, message, message, message, b""]))

        await asyncio.gather(*(one() for _ in range(VOLUME // (4 * MiB))))


async def send_tcp(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    chunk = os.urandom(MiB)
    for _ in range(VOLUME // MiB):
        writer.write(chunk)
        await writer.drain()
    await reader.readexactly(1)
    writer.close()


def percentiles(latencies: list[float]) -> tuple[float, float]:
    latencies.sort()
    return (statistics.median(latencies) * 1e3,
            latencies[int(len(latencies) * 0.99) - 1] * 1e3)


async def latency(kind: str) -> tuple[float, float]:
    """p50 and p99 ms of 2,000 1 KiB round trips, one at a time, to a `kind` server."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(sys.executable, __file__, "--serve", kind,
                                                str(port))
    data, out = os.urandom(1024), []
    try:
        await wait_for_port(port)
        if kind == "grpc":
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.unary_unary("/floors.Sink/Whole")  # type: ignore[call-arg]
                for i in range(2200):
                    start = time.perf_counter()
                    await call(data)
                    if i >= 200:  # after a warm-up
                        out.append(time.perf_counter() - start)
        else:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            for i in range(2200):
                start = time.perf_counter()
                writer.write(data)
                await reader.readexactly(1)
                if i >= 200:
                    out.append(time.perf_counter() - start)
            writer.close()
    finally:
        proc.kill()
        await proc.wait()
    return percentiles(out)


# -- the local parts --------------------------------------------------------------------

def cpu_of(work: Callable[[], None]) -> float:
    """Median CPU s/GB of `work()` (which handles VOLUME bytes) over RUNS runs."""
    figures = []
    for _ in range(RUNS):
        cpu0 = time.process_time()
        work()
        figures.append((time.process_time() - cpu0) / (VOLUME / GB))
    return statistics.median(figures)


def chunks() -> Iterator[bytes]:
    chunk = os.urandom(MiB)
    for _ in range(VOLUME // MiB):
        yield chunk


def sha1_pass() -> None:
    h = hashlib.sha1()
    for chunk in chunks():
        h.update(chunk)


def spool_write(folder: Path) -> Callable[[], None]:
    def work() -> None:
        fd = os.open(folder / "spool", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for i, chunk in enumerate(chunks()):
                os.pwrite(fd, chunk, i * MiB)
        finally:
            os.close(fd)
    return work


def put_cpu_s_per_gb(folder: Path, link: bool) -> float:
    """Median CPU s/GB of RUNS puts of a spool just written (its pages dirty, as a
    closed spool's are): a hard link, or a copy, then an fsync. Writing it is not
    timed (the appends did it)."""
    source, stored = folder / "source", folder / "stored"
    figures = []
    for _ in range(RUNS):
        with open(source, "wb") as fh:
            for chunk in chunks():
                fh.write(chunk)
        stored.unlink(missing_ok=True)
        cpu0 = time.process_time()
        if link:
            os.link(source, stored)
        else:
            with open(source, "rb") as src, open(stored, "wb") as out:
                while os.copy_file_range(src.fileno(), out.fileno(), 1 << 30):
                    pass
        fd = os.open(stored, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        figures.append((time.process_time() - cpu0) / (VOLUME / GB))
    return statistics.median(figures)


async def measure() -> dict[str, float]:
    figures = {
        "grpc_receive_cpu_s_per_gb": await server_cpu_per_gb("grpc", send_grpc),
        "tcp_receive_cpu_s_per_gb": await server_cpu_per_gb("tcp", send_tcp),
    }
    for kind, name in (("grpc", "grpc_unary"), ("tcp", "tcp_echo")):
        figures[f"{name}_p50_ms"], figures[f"{name}_p99_ms"] = await latency(kind)
    with tempfile.TemporaryDirectory(prefix="gazette-floors-") as tmp:
        figures["sha1_cpu_s_per_gb"] = cpu_of(sha1_pass)
        figures["spool_write_cpu_s_per_gb"] = cpu_of(spool_write(Path(tmp)))
        figures["persist_cpu_s_per_gb"] = put_cpu_s_per_gb(Path(tmp), link=True)
        figures["persist_copy_cpu_s_per_gb"] = put_cpu_s_per_gb(Path(tmp), link=False)
    return {k: round(v, 3) for k, v in figures.items()}


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        serve = serve_grpc if sys.argv[2] == "grpc" else serve_tcp
        uvloop.run(serve(int(sys.argv[3])))
        return
    figures = uvloop.run(measure())
    floor = (figures["grpc_receive_cpu_s_per_gb"] + 2 * figures["sha1_cpu_s_per_gb"]
             + figures["spool_write_cpu_s_per_gb"] + figures["persist_cpu_s_per_gb"])
    figures["sum_of_floors_cpu_s_per_gb"] = round(floor, 3)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
