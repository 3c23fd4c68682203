"""Hardening faults against a broker cluster (`gazette serve` processes, two zones) under
continuous appends and re-reads:

(a) etcd is frozen (SIGSTOP) while a fourth broker starts, and thawed (SIGCONT) 5 s later:
    the new broker must come up and join, and the others must survive the freeze;
(b) right after etcd returns, the primary of `hard/tiny` (tiny fragments, persisted and
    re-listed every second) is SIGKILLed, and later restarted;
(c) the store of `hard/failing` fails for 10 s (a regular file takes the place of its
    folder, so uploads fail with an OSError; the test runs as root, so chmod would not
    stop writes), while the other journals must keep persisting promptly; then it heals
    and `hard/failing`'s fragments get persisted.

Meanwhile `hard/tiny` is re-read from offset 0 over and over (non-blocking, through the
journal client and through brokers' HTTP gateways), and followed by a blocking reader.
Afterwards: every acknowledged record of every journal is there exactly once, in its
writer's order, none torn; every persisted fragment's SHA-1 checks and its content is the
journal's; every replica serves the same bytes; every re-read was a prefix of
`hard/tiny`'s final content that, unless it failed or a broker was killed while it went
on, reached the write head it announced (no byte skipped, none cut short mid-body); the
blocking reader saw exactly that content. The test prints a summary: appends acknowledged,
refused and uncertain by status and journal, the client's retries by status, the
re-reads and their outcomes, and the faults injected; then every problem found. Mutual
TLS and authorization are on throughout (etcd's too; HTTP re-reads carry a token).

Lease TTL and etcd freeze: the brokers' leases are *meant to survive* the freeze. With a
TTL of 10 s a broker refreshes its lease every 3.3 s, so at worst 3.3 + 5 = 8.3 s pass
between the last refresh and the first one after the thaw, inside the TTL (etcd's own
clock stops with it, and the broker's view of its lease has 1.7 s left). Primaries stop
taking appends for the last second of their lease as they see it
(NOT_JOURNAL_PRIMARY_BROKER, retried by the client), so a few refusals are expected.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hashlib
import json
import logging
import os
import signal
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gazette.allocator import assignments_of, route_of
from gazette.auth import ClientAuth
from gazette.client import JournalClient, RetryPolicy
from gazette.client.errors import BrokerError, Unavailable
from gazette.fragment.codec import decompress
from gazette.fragment.fragment import Fragment
from gazette.keyspace import Etcd, KeySpace, Layout
from gazette.keyspace.specs import Decoder, apply_changes
from gazette.local.etcd import EmbeddedEtcd
from gazette.local.process import free_port, log_tail
from gazette.pb import broker_pb2 as pb
from gazette.pb import broker_pb2_grpc
from gazette.protocol.trees import journal_changes_from_yaml
from tests.fault.cluster import Broker, Writer, pause, read_from, resume
from tests.fixtures.polling import eventually
from tests.fixtures.security import ClusterSecurity

pytestmark = pytest.mark.integration

PREFIX = "/gazette/hardening"
LEASE_TTL = 10  # see the module's docstring: leases outlive the etcd freeze
ETCD_FREEZE = 5.0
STORE_OUTAGE = 10.0
#: Persisting must keep up with appends during the outage: what was acknowledged in a
#: healthy journal halfway through it must be in its store by the outage's end (a fragment
#: rolls about a second after its first append and its primary uploads it at once; a
#: peer's copy would only be uploaded 5 s after the roll).
OUTAGE_MARK = STORE_OUTAGE / 2

TINY, R3, R2A, R2B, FAILING = "hard/tiny", "hard/r3", "hard/r2a", "hard/r2b", "hard/failing"
REPLICATION = {TINY: 3, R3: 3, R2A: 2, R2B: 2, FAILING: 3}
#: Journals persisting to the healthy store.
HEALTHY = (TINY, R3, R2A, R2B)
JOURNALS = (*HEALTHY, FAILING)
SPECS = """
name: hard/
fragment: {flush_interval: 1s}
children:
- name: hard/tiny
  replication: 3
  fragment: {stores: ["file:///"], length: 4096, compression_codec: NONE,
             refresh_interval: 1s}
- name: hard/r3
  replication: 3
  fragment: {stores: ["file:///"], length: 16384, compression_codec: NONE}
- name: hard/r2a
  replication: 2
  fragment: {stores: ["file:///"], length: 16384, compression_codec: SNAPPY}
- name: hard/r2b
  replication: 2
  fragment: {stores: ["file:///"], length: 16384, compression_codec: GZIP}
- name: hard/failing
  replication: 3
  fragment: {stores: ["file:///failing/"], length: 8192, compression_codec: NONE}
"""
#: Writers per journal and the least time between one writer's appends (pacing bounds
#: how large `hard/tiny` grows, and so how long each re-read of it takes).
WRITERS = {TINY: 2, R3: 1, R2A: 1, R2B: 1, FAILING: 1}
WRITE_INTERVAL = {TINY: 0.03}
DEFAULT_WRITE_INTERVAL = 0.05
#: Least time between two re-reads (pacing: each re-read reads the whole journal).
REREAD_INTERVAL = 0.2
REREAD_TIMEOUT = 45.0
PERSIST_FAILURES_METRIC = "gazette_fragment_persist_failures_total"
KEYSPACE_REVISION_METRIC = "gazette_keyspace_revision"

RENAME_EXCHANGE, AT_FDCWD = 2, -100


def swap_paths(a: Path, b: Path) -> None:
    """Exchange what `a` and `b` name, atomically (Linux renameat2 RENAME_EXCHANGE): no
    upload can slip in between (it would recreate the folder), as it could between two
    renames."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b),
                      RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"renameat2(RENAME_EXCHANGE): {os.strerror(err)}", str(a), None,
                      str(b))


def stored_fragments(store_dir: Path, journal: str) -> list[tuple[Fragment, Path]]:
    """The fragments of `journal` in the `file://` store folder `store_dir`, by offset
    (temporary files of uploads in progress are skipped)."""
    folder = store_dir / journal
    try:
        names = sorted(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for name in names:
        if name.startswith("."):
            continue
        out.append((Fragment.parse_path(f"{journal}/{name}"), folder / name))
    return sorted(out, key=lambda fp: (fp[0].begin, fp[0].end))


def covered_to(fragments: list[tuple[Fragment, Path]]) -> int:
    """How far from offset 0 `fragments` hold every byte."""
    end = 0
    for frag, _ in fragments:
        if frag.begin > end:
            break
        end = max(end, frag.end)
    return end


def first_difference(a: bytes, b: bytes) -> int:
    """The first offset where `a` and `b` differ (within the shorter one), or -1."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return -1
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class RetryCounter(logging.Handler):
    """Counts the journal client's retries (refusals and transport failures it tried
    again) by operation and status, from its INFO log lines."""

    LOGGER = "gazette.client.retry"

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.counts: Counter[str] = Counter()
        self._logger = logging.getLogger(self.LOGGER)
        self._saved = (self._logger.level, self._logger.propagate)

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 4:
            self.counts[f"{args[0]} {args[3]}"] += 1
        else:
            self.counts["other"] += 1

    def __enter__(self) -> RetryCounter:
        self._logger.addHandler(self)
        self._logger.setLevel(logging.INFO)
        self._logger.propagate = False  # thousands of lines: counted, not captured
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._saved[0])
        self._logger.propagate = self._saved[1]


@dataclass
class ReRead:
    """One non-blocking re-read of `hard/tiny` from offset 0."""

    n: int
    via: str
    started: float
    length: int = 0
    #: The write head the read announced (its first chunk's, or the HTTP header).
    announced: int | None = None
    #: What went wrong, if anything ("" if it ended cleanly).
    error: str = ""
    #: Whether its error is excused (the broker it went through was killed meanwhile).
    excused: bool = False
    #: Whether a broker was killed while it went on: a read the client resumed on another
    #: replica may then end at that replica's write head.
    kill_during: bool = False


@dataclass
class ReReads:
    """Every re-read's outcome, and the longest content read so far. Each read is checked
    against the longest so far as it ends (so memory stays small); conflicting reads are
    kept whole, and every read is checked against the final content at the end."""

    longest: bytes = b""
    longest_read: ReRead | None = None
    reads: list[ReRead] = field(default_factory=list)
    #: Reads that disagreed with the longest read so far, with their bytes.
    conflicting: list[tuple[ReRead, bytes]] = field(default_factory=list)
    #: Problems found as reads ended (skips, reads cut short, server errors).
    problems: list[str] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)

    def add(self, read: ReRead, data: bytes) -> None:
        self.reads.append(read)
        read.length = len(data)
        kind = read.via.split()[0]
        outcome = read.error.split(":")[0] if read.error else "ok"
        self.outcomes[f"{kind} {outcome}{' (its broker killed)' if read.excused else ''}"] += 1
        if first_difference(data, self.longest) >= 0:
            if len(self.conflicting) < 20:
                self.conflicting.append((read, data))
        elif len(data) > len(self.longest):
            self.longest, self.longest_read = data, read
        if not read.error and read.announced is not None and len(data) < read.announced \
                and not read.kill_during:
            self.problems.append(
                f"re-read #{read.n} of {TINY} ({read.via}) ended cleanly at offset "
                f"{len(data)}, short of the write head {read.announced} it announced")


@dataclass
class Follower:
    """A blocking read of `hard/tiny` from offset 0, for the whole test."""

    content: bytearray = field(default_factory=bytearray)
    restarts: Counter[str] = field(default_factory=Counter)
    #: Offsets the read jumped over (its chunks' offsets skipped them).
    skips: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        if not self.skips:
            return []
        return [f"the blocking reader of {TINY} skipped content {len(self.skips)} times "
                f"(the chunks' offsets jump): {', '.join(self.skips[:5])}"
                + (", ..." if len(self.skips) > 5 else "")]

    async def run(self, target: str, auth: ClientAuth) -> None:
        retry = RetryPolicy(attempts=100, initial_delay=0.05, max_delay=0.5)
        async with JournalClient(target, retry=retry, timeout=10, auth=auth) as client:
            while True:
                try:
                    async with contextlib.aclosing(client.read(
                            TINY, len(self.content), block=True)) as chunks:
                        async for chunk in chunks:
                            if chunk.offset != len(self.content):
                                self.skips.append(f"[{len(self.content)}, {chunk.offset})")
                            self.content += chunk.content
                except BrokerError as err:
                    self.restarts[f"BrokerError {err.status}"] += 1
                except Unavailable as err:
                    self.restarts[f"Unavailable {err.code}"] += 1
                # The read gave up (after its own retries): read on from where it was,
                # after a pause so that a persistent failure does not spin.
                await asyncio.sleep(0.2)


async def test_cluster_survives_etcd_freeze_primary_kill_and_store_outage_losing_nothing(
        tmp_path: Path) -> None:
    started = time.monotonic()
    security = ClusterSecurity.make(tmp_path / "pki")
    etcd = EmbeddedEtcd(tmp_path / "etcd", tls=security.etcd_tls)
    await asyncio.to_thread(etcd.start)
    store = tmp_path / "store"
    failing_dir, outage_file = store / "failing", store / "failing.outage"
    store_dirs = {j: failing_dir if j == FAILING else store for j in JOURNALS}
    brokers = [Broker(zone, f"broker-{i}", free_port(), tmp_path, etcd.endpoint, PREFIX,
                      LEASE_TTL, security, http_port=free_port())
               for i, zone in enumerate(["zone-a", "zone-a", "zone-b", "zone-b"])]
    first, newcomer = brokers[:3], brokers[3]
    by_id = {b.id: b for b in brokers}
    layout = Layout(PREFIX)
    stop_writing, stop_reading = asyncio.Event(), asyncio.Event()
    writers: list[Writer] = []
    for journal, count in WRITERS.items():
        for _ in range(count):
            writers.append(Writer(len(writers), journal, security.client(),
                                  WRITE_INTERVAL.get(journal, DEFAULT_WRITE_INTERVAL)))
    rereads, follower = ReReads(), Follower()
    faults: list[str] = []
    notes: list[str] = []
    problems: list[str] = []
    tasks: list[asyncio.Task[Any]] = []
    read_clients: dict[str, JournalClient] = {}
    etcd_frozen = False
    outage_on = False
    finals: dict[str, bytes] = {}
    heads: dict[str, int] = {}
    fragment_count = 0
    failed_at = "setup"

    def target(lead: Broker) -> str:
        """A gRPC target of every broker, `lead` first (pick_first takes the first that
        answers)."""
        return "ipv4:" + ",".join(b.address for b in [lead, *(b for b in brokers
                                                             if b is not lead)])

    def acked(journal: str) -> int:
        return sum(len(w.acked) for w in writers if w.journal == journal)

    def acked_end(journal: str) -> int:
        return max(w.acked_end for w in writers if w.journal == journal)

    def outcomes(journal: str | None = None) -> Counter[str]:
        total: Counter[str] = Counter()
        for w in writers:
            if journal is None or w.journal == journal:
                total.update(w.outcomes)
        return total

    def kills() -> int:
        return sum(b.kills for b in brokers)

    def exited(b: Broker) -> str:
        popen = b.process.popen
        code = popen.returncode if popen is not None else None
        return f"{b.name} exited with status {code}; log {b.log_path}:\n{log_tail(b.log_path)}"

    async def reread_grpc(n: int, lead: Broker) -> None:
        client = read_clients.get(lead.name)
        if client is None:
            retry = RetryPolicy(attempts=20, initial_delay=0.05, max_delay=0.5)
            client = read_clients[lead.name] = JournalClient(
                target(lead), retry=retry, timeout=10, auth=security.client())
        read = ReRead(n, f"gRPC via client of ipv4:{lead.address},... (first {lead.name})",
                      time.monotonic())
        kills_before = kills()
        data = bytearray()
        skips: list[str] = []  # offsets the read jumped over
        try:
            async with asyncio.timeout(REREAD_TIMEOUT), \
                    contextlib.aclosing(client.read(TINY, 0)) as chunks:
                async for chunk in chunks:
                    if read.announced is None:
                        read.announced = chunk.write_head
                    if chunk.offset != len(data):
                        skips.append(f"[{len(data)}, {chunk.offset})")
                    data += chunk.content
        except BrokerError as err:
            read.error = f"BrokerError {err.status}: {err}"
            if err.status == "DATA_LOSS":
                rereads.problems.append(f"re-read #{n} of {TINY} ({read.via}): {err}")
        except Unavailable as err:
            read.error = f"Unavailable {err.code}: {err}"
        except TimeoutError:
            timed_out(n, read, len(data))
        read.kill_during = kills() != kills_before
        if skips:
            rereads.problems.append(
                f"re-read #{n} of {TINY} ({read.via}) skipped content {len(skips)} times "
                f"(the chunks' offsets jump): {', '.join(skips[:5])}"
                + (", ..." if len(skips) > 5 else ""))
        rereads.add(read, bytes(data))

    def timed_out(n: int, read: ReRead, offset: int) -> None:
        read.error = f"timeout: no end after {REREAD_TIMEOUT:.0f}s"
        rereads.problems.append(f"re-read #{n} of {TINY} ({read.via}), a non-blocking "
                                f"read, did not end within {REREAD_TIMEOUT:.0f}s "
                                f"(at offset {offset})")

    async def reread_http(n: int, b: Broker, http: aiohttp.ClientSession) -> None:
        read = ReRead(n, f"HTTP GET {b.http_url}/{TINY}?offset=0 ({b.name})",
                      time.monotonic())
        killed, kills_before = b.kills, kills()
        data = bytearray()
        try:
            async with http.get(f"{b.http_url}/{TINY}", params={"offset": "0"},
                                timeout=aiohttp.ClientTimeout(total=REREAD_TIMEOUT)) as resp:
                if resp.status != 200:
                    reason = (await resp.text()).strip()[:200]
                    read.error = f"HTTP {resp.status}: {reason}"
                    if resp.status >= 500 and resp.status != 503:
                        rereads.problems.append(f"re-read #{n} of {TINY} ({read.via}) "
                                                f"answered {resp.status}: {reason}")
                else:
                    head = resp.headers.get("X-Gazette-Write-Head")
                    read.announced = int(head) if head is not None else None
                    if head is None:
                        rereads.problems.append(f"re-read #{n} of {TINY} ({read.via}) "
                                                f"announced no X-Gazette-Write-Head")
                    offset = resp.headers.get("X-Gazette-Offset", "0")
                    if offset != "0":
                        rereads.problems.append(
                            f"re-read #{n} of {TINY} ({read.via}) asked for offset 0 and "
                            f"started at offset {offset} (X-Gazette-Offset)")
                    async for block in resp.content.iter_chunked(1 << 16):
                        data += block
        except aiohttp.ClientPayloadError as err:
            read.error = f"cut short: {err}"
            read.excused = b.kills != killed or not b.process.running()
            if not read.excused:
                rereads.problems.append(
                    f"re-read #{n} of {TINY} ({read.via}) was cut short mid-body after "
                    f"{len(data)} bytes (announced write head {read.announced}) while "
                    f"{b.name} was running: {err}")
        except (aiohttp.ClientError, OSError) as err:
            read.error = f"{type(err).__name__}: {err}"
        except TimeoutError:
            timed_out(n, read, len(data))
        read.kill_during = kills() != kills_before
        rereads.add(read, bytes(data))

    async def reread_loop() -> None:
        async with security.http() as http:
            n = 0
            while not stop_reading.is_set():
                live = [b for b in brokers if b.process.running()] or brokers
                b = live[(n // 2) % len(live)]
                if n % 2 == 0:
                    await reread_grpc(n, b)
                else:
                    await reread_http(n, b, http)
                n += 1
                await asyncio.sleep(REREAD_INTERVAL)  # pacing, not synchronization

    async def metric(http: aiohttp.ClientSession, b: Broker, name: str) -> list[float] | None:
        """`b`'s samples of metric `name` (None if its metrics cannot be read)."""
        try:
            async with http.get(f"{b.http_url}/metrics",
                                timeout=aiohttp.ClientTimeout(total=5)) as resp:
                text = await resp.text()
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None
        return [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith((name + " ", name + "{"))]

    async def persist_failures(http: aiohttp.ClientSession) -> float:
        """The persist-failure counters of every running broker, summed."""
        total = 0.0
        for b in brokers:
            if b.process.running():
                total += sum(await metric(http, b, PERSIST_FAILURES_METRIC) or [])
        return total

    async def views(http: aiohttp.ClientSession) -> dict[str, int | None]:
        """The etcd revision each running broker's keyspace reflects."""
        out: dict[str, int | None] = {}
        for b in brokers:
            if b.process.running():
                values = await metric(http, b, KEYSPACE_REVISION_METRIC)
                out[b.name] = int(min(values)) if values else None
        return out

    retries = RetryCounter()
    try:
        retries.__enter__()
        for b in first:
            b.start()
        async with Etcd(etcd.endpoint, tls=security.etcd_tls) as client, \
                KeySpace(client, layout.root + "/", Decoder(layout)) as keyspace, \
                security.http() as http:

            def route_ok(journal: str) -> bool:
                assigned = assignments_of(keyspace, layout, journal)
                route = route_of(assigned)
                return len(assigned) == REPLICATION[journal] and route.primary >= 0 and all(
                    a.value == route.encode() for a in assigned)

            def all_routed() -> bool:
                return all(route_ok(j) for j in JOURNALS)

            def unrouted() -> str:
                """Each journal not routed yet, and what its assignments hold."""
                out = []
                for j in JOURNALS:
                    if route_ok(j):
                        continue
                    assigned = assignments_of(keyspace, layout, j)
                    value = route_of(assigned).encode()
                    held = [f"{by_id[a.member].name if a.member in by_id else a.member} "
                            f"slot {a.slot}: " + ("the route" if a.value == value else
                                                  "no route" if not a.value else
                                                  "another route")
                            + f" (mod revision {a.mod_revision})" for a in assigned]
                    out.append(f"{j} ({len(assigned)} of {REPLICATION[j]} assigned; "
                               f"{describe_route(j)}; assignments: {', '.join(held)})")
                members = [e.key.rsplit("/", 1)[-1]
                           for e in keyspace.prefixed(layout.members)]
                return f"not routed: {'; '.join(out)}; members {members}"

            async def etcd_revision() -> int:
                return (await client.get_prefix(layout.members)).revision

            async def cluster_views() -> str:
                return (f"etcd at revision {await etcd_revision()}, brokers' keyspaces at "
                        f"{await views(http)}")

            async def routed(what: str, timeout: float = 40) -> None:
                try:
                    await eventually(all_routed, what, timeout)
                except AssertionError as err:
                    raise AssertionError(f"{err}: {unrouted()}; {await cluster_views()}") \
                        from None

            def describe_route(journal: str) -> str:
                route = route_of(assignments_of(keyspace, layout, journal))
                members = [by_id[m].name if m in by_id else str(m) for m in route.members]
                lead = primary(journal)
                return f"primary {lead.name if lead else None}, members {members}"

            def primary(journal: str) -> Broker | None:
                route = route_of(assignments_of(keyspace, layout, journal))
                return by_id.get(route.primary_id) if route.primary_id is not None else None

            def joined(b: Broker) -> bool:
                if not b.process.running():
                    raise AssertionError(f"{b.name} is not running ({failed_at}): {exited(b)}")
                return keyspace.get(layout.member_key(b.zone, b.name)) is not None

            async def progress(more: int = 20, timeout: float = 40,
                               journals: tuple[str, ...] = JOURNALS) -> None:
                goals = {j: acked(j) + more for j in journals}
                try:
                    await eventually(lambda: all(acked(j) >= g for j, g in goals.items()),
                                     f"{more} more acknowledged appends to each journal",
                                     timeout)
                except AssertionError as err:
                    lagging = {j: f"{acked(j) - goals[j] + more} of {more}"
                               for j in journals if acked(j) < goals[j]}
                    raise AssertionError(
                        f"{err}: lagging {lagging}; routes "
                        f"{ {j: describe_route(j) for j in lagging} }; outcomes "
                        f"{ {j: dict(outcomes(j)) for j in lagging} }; "
                        f"{await cluster_views()}; faults so far {faults}") from None

            failed_at = "start"
            await eventually(lambda: all(joined(b) for b in first), "three brokers joined",
                             30)
            await apply_changes(client, layout, journal_changes_from_yaml(SPECS))
            await routed("every journal is routed", 30)
            tasks += [asyncio.create_task(w.run(target(first[w.id % 3]), stop_writing))
                      for w in writers]
            await progress(30)
            tasks.append(asyncio.create_task(follower.run(target(first[1]), security.client())))
            tasks.append(asyncio.create_task(reread_loop()))
            await eventually(lambda: len(rereads.reads) >= 4, "a few re-reads are done", 30)

            # (a) etcd frozen while a new broker starts.
            failed_at = "(a) etcd frozen while a new broker starts"
            for b in first:
                assert joined(b), f"{b.name} is not a member before etcd is frozen"
            pause(etcd.process)
            etcd_frozen = True
            frozen_at = time.monotonic()
            faults.append("SIGSTOP etcd")
            newcomer.start()
            faults.append(f"start {newcomer.name} while etcd is frozen")
            # The freeze lasting ETCD_FREEZE seconds is the fault itself (not a wait for
            # anything): the new broker's start meets an etcd that answers nothing.
            await asyncio.sleep(ETCD_FREEZE)
            resume(etcd.process)
            etcd_frozen = False
            faults.append(f"SIGCONT etcd after {time.monotonic() - frozen_at:.1f}s")

            # (b) right after etcd returns: SIGKILL the primary of hard/tiny.
            failed_at = "(b) SIGKILL the primary of hard/tiny"
            victim = primary(TINY)
            assert victim is not None, f"{TINY} has no primary: {describe_route(TINY)}"
            await asyncio.to_thread(victim.kill)
            faults.append(f"SIGKILL {victim.name} (primary of {TINY})")

            failed_at = "(a) the new broker joins after etcd was frozen at its start"
            await eventually(lambda: joined(newcomer),
                             f"{newcomer.name}, started while etcd was frozen, joined", 40)

            async def healthy() -> bool:
                with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                    async with http.get(f"{newcomer.http_url}/healthz",
                                        timeout=aiohttp.ClientTimeout(total=2)) as resp:
                        return resp.status == 200
                return False

            await eventually(healthy, f"{newcomer.name} answers /healthz with 200", 30)
            for b in first:
                if b is not victim:
                    assert b.process.running(), \
                        f"{b.name} did not survive the {ETCD_FREEZE:.0f}s etcd freeze " \
                        f"(lease TTL {LEASE_TTL}s): {exited(b)}"
            # Every broker's view of etcd follows it again after the freeze (a watch
            # that did not resume leaves a broker, and its allocator, on an old revision).
            now_at = await etcd_revision()
            seen: dict[str, int | None] = {}

            async def caught_up() -> bool:
                seen.update(await views(http))
                return all(v is not None and v >= now_at for n, v in seen.items()
                           if n != victim.name)

            try:
                await eventually(caught_up, "every broker follows etcd again", 20)
            except AssertionError as err:
                stale = {n: v for n, v in seen.items() if n != victim.name and
                         (v is None or v < now_at)}
                raise AssertionError(
                    f"{err}: after etcd was frozen for {ETCD_FREEZE:.0f}s, the keyspace of "
                    + ", ".join(f"{n} is still at revision {v}" for n, v in stale.items())
                    + f" ({KEYSPACE_REVISION_METRIC}) while etcd was at {now_at} 20s "
                    f"earlier: its etcd watch did not resume") from None

            failed_at = "(b) failover after SIGKILL of the primary of hard/tiny"
            key = layout.member_key(victim.zone, victim.name)
            await eventually(lambda: keyspace.get(key) is None,
                             f"the lease of {victim.name} (killed) expired", 3 * LEASE_TTL)
            try:
                await eventually(lambda: primary(TINY) not in (None, victim),
                                 f"another broker is primary of {TINY}", 3 * LEASE_TTL)
            except AssertionError as err:
                raise AssertionError(f"{err}: {TINY}'s route {describe_route(TINY)}; "
                                     f"{await cluster_views()}") from None
            await routed(f"every journal is routed again without {victim.name}")
            await progress()
            victim.start()
            faults.append(f"restart {victim.name}")
            await eventually(lambda: joined(victim), f"{victim.name} rejoined", 40)
            await routed(f"every journal is routed with {victim.name} back")
            await progress()

            # (c) the store of hard/failing fails for STORE_OUTAGE seconds.
            failed_at = "(c) before the store outage"
            await eventually(lambda: covered_to(stored_fragments(failing_dir, FAILING)) > 0,
                             f"{FAILING} has fragments persisted before its store fails", 30)
            failures_before = await persist_failures(http)
            outage_file.write_text("a file where the store's folder was: uploads fail\n")
            swap_paths(failing_dir, outage_file)
            outage_on = True
            outage_at = time.monotonic()
            faults.append(f"store of {FAILING} fails ({failing_dir} is a file)")
            failed_at = "(c) during the store outage"

            async def uploads_failed() -> bool:
                return await persist_failures(http) > failures_before

            await eventually(uploads_failed,
                             f"the brokers count failed uploads ({PERSIST_FAILURES_METRIC} "
                             f"rises) once {FAILING}'s store folder is a file",
                             OUTAGE_MARK)
            # The outage lasting STORE_OUTAGE seconds is the point: sleeping lets it last.
            await asyncio.sleep(max(0.0, outage_at + OUTAGE_MARK - time.monotonic()))
            mark_heads = {j: acked_end(j) for j in HEALTHY}
            mark_acked = {j: acked(j) for j in HEALTHY}
            deadline = outage_at + STORE_OUTAGE

            def keeping_up() -> bool:
                return all(covered_to(stored_fragments(store, j)) >= mark_heads[j]
                           for j in HEALTHY)

            try:
                await eventually(keeping_up, "the healthy journals persist what was "
                                 "acknowledged", max(0.0, deadline - time.monotonic()))
            except AssertionError:
                behind: list[str] = []
                for j in HEALTHY:
                    stored = stored_fragments(store, j)
                    covered = covered_to(stored)
                    if covered < mark_heads[j]:
                        behind.append(
                            f"{j} (route: {describe_route(j)}) had appends acknowledged up "
                            f"to offset {mark_heads[j]} {OUTAGE_MARK:.0f}s into the outage, "
                            f"but {STORE_OUTAGE - OUTAGE_MARK:.0f}s later its store holds "
                            f"only [0, {covered}) ({len(stored)} fragments; "
                            f"{acked(j) - mark_acked[j]} appends acknowledged meanwhile)")
                raise AssertionError(
                    f"while only {FAILING}'s store fails (its route: "
                    f"{describe_route(FAILING)}), other journals stop persisting: "
                    + "; ".join(behind)) from None
            notes.append(f"during the outage the healthy journals persisted what was "
                         f"acknowledged {OUTAGE_MARK:.0f}s into it within "
                         f"{time.monotonic() - outage_at - OUTAGE_MARK:.1f}s")
            # Let the outage last its whole time (the duration is the point).
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))
            failed_head = acked_end(FAILING)
            failures_during = await persist_failures(http) - failures_before
            swap_paths(failing_dir, outage_file)
            outage_on = False
            outage_file.unlink()
            faults.append(f"store of {FAILING} heals after {time.monotonic() - outage_at:.0f}s"
                          f" ({failures_during:.0f} failed uploads counted)")
            failed_at = "(c) after the store outage"
            try:
                await eventually(
                    lambda: covered_to(stored_fragments(failing_dir, FAILING)) >= failed_head,
                    f"{FAILING}'s fragments are persisted once its store heals", 60)
            except AssertionError as err:
                stored = stored_fragments(failing_dir, FAILING)
                raise AssertionError(
                    f"{err}: {FAILING} had appends acknowledged up to offset {failed_head} "
                    f"when its store healed, but 60s later the store holds only "
                    f"[0, {covered_to(stored)}) ({len(stored)} fragments; route "
                    f"{describe_route(FAILING)})") from None
            await progress()

            # The end: writers and readers stop; every replica serves the same bytes.
            failed_at = "the end"
            stop_writing.set()
            await asyncio.gather(*tasks[:len(writers)])
            stop_reading.set()
            await routed("every journal is routed once writers stopped", 30)
            for journal in JOURNALS:
                lead = primary(journal)
                assert lead is not None, f"{journal} has no primary"
                async with security.channel(lead.address) as ch:
                    resp = await anext(aiter(broker_pb2_grpc.JournalStub(ch).Read(
                        pb.ReadRequest(journal=journal, offset=-1, metadata_only=True,
                                       do_not_proxy=True))))
                heads[journal] = resp.write_head
                route = route_of(assignments_of(keyspace, layout, journal))
                members = [by_id[m] for m in route.members]
                contents = {b.name: await read_from(b, journal, heads[journal], timeout=15)
                            for b in members}
                # The reference: the primary's bytes if it serves them up to the write
                # head, else another replica's that does.
                whole = [n for n, c in contents.items() if len(c) == heads[journal]]
                ref = lead.name if lead.name in whole else (whole or [lead.name])[0]
                finals[journal] = contents[ref]
                for name, content in contents.items():
                    role = " (primary)" if name == lead.name else ""
                    at = first_difference(content, finals[journal])
                    if at >= 0:
                        problems.append(
                            f"{journal}: {name}{role} serves other bytes than {ref} from "
                            f"offset {at} ({len(content)} bytes served, write head "
                            f"{heads[journal]}): {_around(content, at)} where {ref} has "
                            f"{_around(finals[journal], at)}")
                    elif len(content) != heads[journal]:
                        problems.append(
                            f"{journal}: {name}{role} serves only {len(content)} bytes "
                            f"(do_not_proxy, retried for 15s) of the {heads[journal]} up to "
                            f"the write head")
            try:
                await eventually(lambda: len(follower.content) >= len(finals[TINY]),
                                 f"the blocking reader of {TINY} reached its write head", 20)
            except AssertionError as err:
                problems.append(f"{err}: it read {len(follower.content)} of "
                                f"{len(finals[TINY])} bytes")
            try:
                await eventually(lambda: all(covered_to(stored_fragments(store_dirs[j], j))
                                             >= heads[j] for j in JOURNALS),
                                 "every journal is persisted up to its write head", 30)
            except AssertionError as err:
                problems.append(f"{err}: " + ", ".join(
                    f"{j} [0, {covered_to(stored_fragments(store_dirs[j], j))}) of "
                    f"{heads[j]}" for j in JOURNALS))
            for b in brokers:
                if not b.process.running():
                    problems.append(f"{b.name} is not running at the end: {exited(b)}")
    finally:
        stop_writing.set()
        stop_reading.set()
        if etcd_frozen:
            resume(etcd.process)
        if outage_on:
            with contextlib.suppress(OSError):
                swap_paths(failing_dir, outage_file)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in read_clients.values():
            await c.close()
        for b in brokers:
            await asyncio.to_thread(b.process.stop, 20.0, signal.SIGKILL)
        await asyncio.to_thread(etcd.stop)
        retries.__exit__()
        print(f"\nhardening fault test (reached: {failed_at}): "
              f"{summary(writers, rereads, follower)}; client retries by operation and "
              f"status {dict(sorted(retries.counts.items()))}; faults: {'; '.join(faults)}; "
              f"{time.monotonic() - started:.0f}s")

    # Every acknowledged record is there exactly once, in order; none torn.
    for journal in JOURNALS:
        problems += check_records(journal, finals[journal],
                                  [w for w in writers if w.journal == journal])
    # Every persisted fragment checks, and holds the journal's bytes.
    for journal in JOURNALS:
        bad = []
        for frag, path in stored_fragments(store_dirs[journal], journal):
            fragment_count += 1
            problem = check_fragment(frag, path, finals[journal])
            if problem:
                bad.append(problem)
        if bad:
            problems.append(f"{journal}: {len(bad)} persisted fragments are wrong: "
                            + "; ".join(bad[:3]) + ("; ..." if len(bad) > 3 else ""))
    # Every re-read was a prefix of the final content; the blocking reader read it all.
    final = finals[TINY]
    problems += rereads.problems + follower.problems
    at = first_difference(rereads.longest, final)
    if at >= 0 or len(rereads.longest) > len(final):
        problems.append(_reread_mismatch(rereads.longest_read, rereads.longest, final))
    for read, data in rereads.conflicting:
        if first_difference(data, final) >= 0 or len(data) > len(final):
            problems.append(_reread_mismatch(read, data, final))
    at = first_difference(bytes(follower.content), final)
    if at >= 0:
        problems.append(f"the blocking reader of {TINY} read other bytes than the journal "
                        f"holds from offset {at}: {_around(bytes(follower.content), at)} "
                        f"instead of {_around(final, at)}")
    notes.append(f"{fragment_count} fragments checked")
    print(f"hardening fault test: {'; '.join(notes)}; "
          f"{len(problems)} problems" + (":\n  " + "\n  ".join(problems[:40]) if problems
                                         else ""))
    assert not problems, f"{len(problems)} problems; the first: {problems[0]}"


def _around(content: bytes, at: int, width: int = 40) -> str:
    return repr(content[max(0, at - 8):at + width])


def _reread_mismatch(read: ReRead | None, data: bytes, final: bytes) -> str:
    what = f"re-read #{read.n} of {TINY} ({read.via})" if read else f"a re-read of {TINY}"
    at = first_difference(data, final)
    if at < 0:
        return (f"{what} read {len(data)} bytes, more than the journal's final "
                f"{len(final)}")
    return (f"{what} is no prefix of the journal: from offset {at} it read "
            f"{_around(data, at)} where the journal holds {_around(final, at)} "
            f"(read length {len(data)}, announced write head {read.announced if read else '?'})")


def check_records(journal: str, content: bytes, writers: list[Writer]) -> list[str]:
    """Problems with `journal`'s records: torn or interleaved ones (with their offsets),
    acknowledged ones missing, duplicated or out of order, and records present that were
    refused or never sent."""
    problems = []
    by_writer: dict[int, list[tuple[int, int]]] = defaultdict(list)  # w -> [(seq, offset)]
    offset = 0
    for line in content.splitlines(keepends=True):
        try:
            assert line.endswith(b"\n"), "no newline at the end of the journal"
            rec = json.loads(line)
            body = f'{{"w": {rec["w"]}, "seq": {rec["seq"]}, "pad": "{rec["pad"]}"'
            assert hashlib.sha1(body.encode()).hexdigest()[:16] == rec["sum"], \
                "its checksum does not match"
            assert line == Writer.record(rec["w"], rec["seq"]), "it is not as written"
            by_writer[rec["w"]].append((rec["seq"], offset))
        except (AssertionError, ValueError, KeyError) as err:
            problems.append(f"{journal}: a torn or interleaved record at offset {offset} "
                            f"({err}): {line[:80]!r}")
        offset += len(line)
    for w in writers:
        seen = by_writer.get(w.id, [])
        seqs = [s for s, _ in seen]
        first_at: dict[int, int] = {}
        for i, (seq, at) in enumerate(seen):
            if seq in first_at:
                problems.append(f"{journal}: writer {w.id}'s record {seq} is there twice, "
                                f"at offsets {first_at[seq]} and {at}")
            first_at.setdefault(seq, at)
            if i and seq < seqs[i - 1]:
                problems.append(f"{journal}: writer {w.id}'s record {seq} at offset {at} "
                                f"comes after its record {seqs[i - 1]}")
        lost = sorted(set(w.acked) - set(seqs))
        if lost:
            problems.append(f"{journal}: {len(lost)} acknowledged records of writer {w.id} "
                            f"are missing, e.g. seq {lost[:10]}")
        extra = sorted(set(seqs) - set(w.acked) - w.uncertain)
        if extra:
            problems.append(f"{journal}: records of writer {w.id} neither acknowledged nor "
                            f"uncertain are present (refused: "
                            f"{sorted(set(extra) & w.refused)[:10]}), e.g. seq {extra[:10]} "
                            f"at offset {first_at[extra[0]]}")
    return problems


def check_fragment(frag: Fragment, path: Path, final: bytes) -> str:
    """A problem with the persisted fragment at `path`, or ""."""
    try:
        data = decompress(frag.codec, path.read_bytes())
    except Exception as err:  # noqa: BLE001 - any failure to decode is the finding
        return f"{frag.journal}: fragment {path.name} does not decode: {err}"
    if len(data) != frag.size:
        return (f"{frag.journal}: fragment {path.name} holds {len(data)} bytes, its name "
                f"says {frag.size}")
    if hashlib.sha1(data).digest() != frag.sha1:
        return f"{frag.journal}: fragment {path.name}: its SHA-1 does not check"
    if frag.end > len(final):
        return (f"{frag.journal}: fragment {path.name} ends at {frag.end}, past the "
                f"journal's final write head {len(final)}")
    at = first_difference(data, final[frag.begin:frag.end])
    if at >= 0:
        return (f"{frag.journal}: fragment {path.name} holds other bytes than the journal "
                f"from offset {frag.begin + at}")
    return ""


def summary(writers: list[Writer], rereads: ReReads, follower: Follower) -> str:
    parts = []
    total: Counter[str] = Counter()
    by_journal: dict[str, Counter[str]] = defaultdict(Counter)
    for w in writers:
        by_journal[w.journal].update(w.outcomes)
        total.update(w.outcomes)

    def fmt(c: Counter[str]) -> str:
        acked = c.get("acknowledged", 0)
        uncertain = c.get("uncertain", 0)
        refused = {k: v for k, v in sorted(c.items()) if k not in ("acknowledged",
                                                                     "uncertain")}
        return (f"{acked} acknowledged, {sum(refused.values())} refused"
                + (f" {refused}" if refused else "") + f", {uncertain} uncertain")

    for journal, c in by_journal.items():
        parts.append(f"{journal}: {fmt(c)}")
    grpc_reads = sum(1 for r in rereads.reads if r.via.startswith("gRPC"))
    http_reads = len(rereads.reads) - grpc_reads
    return (f"appends: {fmt(total)} ({'; '.join(parts)}); re-reads of {TINY}: "
            f"{len(rereads.reads)} ({grpc_reads} gRPC, {http_reads} HTTP; outcomes "
            f"{dict(sorted(rereads.outcomes.items()))}; longest {len(rereads.longest)} "
            f"bytes); blocking reader: {len(follower.content)} bytes, restarts "
            f"{dict(follower.restarts)}")

