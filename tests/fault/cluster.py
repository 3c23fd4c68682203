"""Shared pieces of the fault tests: `gazette serve` processes that keep their name, ports
and spool folder across restarts (with mutual TLS and authorization on, as every fault
suite runs: `tests.fixtures.security.ClusterSecurity`), writers of self-describing
records, a producer of messages (a `Publisher` over an `AppendQueue`, as applications
publish), parsing and checking what a journal holds, reading what one broker itself
serves, and freezing a process (SIGSTOP/SIGCONT)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from gazette.auth import ClientAuth
from gazette.client import AppendQueue, AppendUncertain, JournalClient, RetryPolicy
from gazette.client.errors import BrokerError, Unavailable
from gazette.local.process import Process
from gazette.message import JsonMessage, Partition, Publisher
from gazette.pb import broker_pb2 as pb
from gazette.pb import broker_pb2_grpc
from gazette.protocol import ProcessId
from tests.fixtures.broker import DATA_PORT
from tests.fixtures.security import ClusterSecurity


@dataclass
class Broker:
    """A `gazette serve` process that keeps its name, ports and spool folder across
    restarts, serving with `security`. Its `file:///` store root is `workdir / "store"`;
    `http_port` -1: no HTTP gateway."""

    zone: str
    name: str
    port: int
    workdir: Path
    etcd: str
    prefix: str
    lease_ttl: int
    security: ClusterSecurity
    http_port: int = -1
    #: Its data path's port (0: any free one; -1: none): on as the suites' runs say.
    data_port: int = DATA_PORT
    process: Process = field(init=False)
    #: How often this broker was SIGKILLed by the test.
    kills: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        argv = [sys.executable, "-m", "gazette_broker.cli", "serve",
                "--broker.zone", self.zone, "--broker.id", self.name,
                "--broker.host", "127.0.0.1", "--broker.bind", "127.0.0.1",
                "--broker.port", str(self.port), "--broker.http-port", str(self.http_port),
                "--broker.file-root", str(self.workdir / "store"),
                "--broker.spool-dir", str(self.workdir / f"spools-{self.name}"),
                "--broker.lease-ttl", str(self.lease_ttl), "--broker.grace", "2",
                "--broker.drain-timeout", "20",
                "--etcd.address", self.etcd, "--etcd.prefix", self.prefix,
                "--broker.data-port", str(self.data_port), *self.security.flags()]
        self.process = Process(self.name, argv, self.workdir / f"{self.name}.log")

    @property
    def id(self) -> ProcessId:
        return ProcessId(self.zone, self.name)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"https://127.0.0.1:{self.http_port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def start(self) -> None:
        self.process.start()

    def kill(self) -> None:
        """SIGKILL, as a crash would (blocking: call it in a thread)."""
        self.kills += 1
        self.process.kill()


def pause(process: Process) -> None:
    """Freeze `process` (SIGSTOP): it keeps its sockets but answers nothing."""
    os.kill(process.pid, signal.SIGSTOP)


def resume(process: Process) -> None:
    """Thaw a process frozen by `pause` (SIGCONT); harmless if it is not frozen."""
    if process.running():
        os.kill(process.pid, signal.SIGCONT)


@dataclass
class Writer:
    """Appends records `{"w", "seq", "pad", "sum"}` to `journal` one at a time (every
    `interval` seconds at most, if given); remembers which were acknowledged, which are
    uncertain (the answer to their commit was lost) and which were refused (certainly not
    written), and counts outcomes by status."""

    id: int
    journal: str
    auth: ClientAuth
    interval: float = 0.0
    acked: list[int] = field(default_factory=list)
    uncertain: set[int] = field(default_factory=set)
    refused: set[int] = field(default_factory=set)
    acked_at: list[float] = field(default_factory=list)
    #: The end offset of the furthest acknowledged append.
    acked_end: int = 0
    #: Outcomes by status: "acknowledged", "uncertain", "refused <status>" (a BrokerError)
    #: and "unavailable <gRPC code>" (an Unavailable).
    outcomes: Counter[str] = field(default_factory=Counter)

    @staticmethod
    def record(w: int, seq: int) -> bytes:
        pad = "x" * (50 + (w * 7919 + seq * 104729) % 400)
        body = f'{{"w": {w}, "seq": {seq}, "pad": "{pad}"'
        digest = hashlib.sha1(body.encode()).hexdigest()[:16]
        return (body + f', "sum": "{digest}"}}\n').encode()

    async def run(self, target: str, stop: asyncio.Event) -> None:
        retry = RetryPolicy(attempts=60, initial_delay=0.05, max_delay=0.5)
        async with JournalClient(target, retry=retry, timeout=10, auth=self.auth) as client:
            seq = 0
            while not stop.is_set():
                started = time.monotonic()
                try:
                    result = await client.append(self.journal, self.record(self.id, seq))
                    self.acked.append(seq)
                    self.acked_at.append(time.monotonic())
                    self.acked_end = max(self.acked_end, result.commit.end)
                    self.outcomes["acknowledged"] += 1
                except AppendUncertain:
                    self.uncertain.add(seq)
                    self.outcomes["uncertain"] += 1
                except BrokerError as err:
                    self.refused.add(seq)  # certainly not written
                    self.outcomes[f"refused {err.status}"] += 1
                except Unavailable as err:
                    self.refused.add(seq)  # certainly not written
                    self.outcomes[f"unavailable {err.code}"] += 1
                seq += 1
                if self.interval:
                    # Pacing (not synchronization): bounds how fast the journal grows.
                    await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))


@dataclass
class Producer:
    """Publishes messages ``{"n": 0, 1, ...}`` to `journal` one after another (each
    awaited), as an application does: a `Publisher` over an `AppendQueue`, on a
    `JournalClient` with its default retry policy. Remembers when each was acknowledged,
    and which were acknowledged, uncertain or refused (certainly not written)."""

    journal: str
    auth: ClientAuth
    acked: list[int] = field(default_factory=list)
    acked_at: list[float] = field(default_factory=list)
    uncertain: set[int] = field(default_factory=set)
    refused: Counter[str] = field(default_factory=Counter)

    async def run(self, target: str, stop: asyncio.Event) -> None:
        part = Partition(self.journal, "application/x-ndjson")
        async with JournalClient(target, auth=self.auth) as client, \
                AppendQueue(client) as queue:
            publisher = Publisher(queue)
            n = 0
            while not stop.is_set():
                try:
                    await publisher.publish_committed(lambda _: part, JsonMessage(n=n))
                    self.acked.append(n)
                    self.acked_at.append(time.monotonic())
                except AppendUncertain:
                    self.uncertain.add(n)
                except (BrokerError, Unavailable) as err:
                    self.refused[type(err).__name__] += 1
                n += 1
                await asyncio.sleep(0.01)  # pacing, not synchronization

    def stall_after(self, moment: float) -> float:
        """Seconds from `moment` to the first acknowledgment after it."""
        return min((t for t in self.acked_at if t > moment), default=float("inf")) - moment

    def check(self, content: bytes) -> None:
        """Every acknowledged message is in `content` once; nothing else is but those
        in doubt."""
        numbers = [json.loads(line)["n"] for line in content.splitlines()]
        assert len(numbers) == len(set(numbers)), "a message was written twice"
        present = set(numbers)
        lost = set(self.acked) - present
        assert not lost, f"acknowledged messages lost: {sorted(lost)[:10]}"
        assert present <= set(self.acked) | self.uncertain, \
            "messages never acknowledged nor in doubt are present"


def parse(content: bytes) -> list[tuple[int, int]]:
    """(writer, seq) of every record; asserts each line is one whole record."""
    out = []
    for line in content.splitlines(keepends=True):
        assert line.endswith(b"\n"), f"a torn record at the end: {line[:80]!r}"
        rec = json.loads(line)
        body = f'{{"w": {rec["w"]}, "seq": {rec["seq"]}, "pad": "{rec["pad"]}"'
        assert hashlib.sha1(body.encode()).hexdigest()[:16] == rec["sum"], line[:80]
        assert line == Writer.record(rec["w"], rec["seq"]), "an interleaved record"
        out.append((rec["w"], rec["seq"]))
    return out


async def read_from(broker: Broker, journal: str, head: int, timeout: float = 60) -> bytes:
    """Everything `broker` itself serves of `journal` up to `head` (do_not_proxy);
    a read stopped short (content still being persisted by a peer) is tried again, for
    up to `timeout` seconds."""
    async with broker.security.channel(broker.address) as ch:
        stub = broker_pb2_grpc.JournalStub(ch)
        deadline = time.monotonic() + timeout
        while True:
            out = bytearray()
            async for resp in stub.Read(pb.ReadRequest(journal=journal, do_not_proxy=True,
                                                       end_offset=head)):
                if resp.status != pb.OK:
                    break
                out += resp.content
            if len(out) == head or time.monotonic() > deadline:
                return bytes(out)
            await asyncio.sleep(0.2)
