"""Cluster scale: what the number of journals costs a cluster of `gazette serve` brokers.

Every etcd event reaches every broker: its sync brings the journals the event touches in
line, and its allocator decides whether the event can move an assignment (the leader
then solves and writes). This part measures what the number of journals costs that, on
the etcd the caller started (each cluster under an etcd prefix of its own, stopped
before the next):

- ``converge_s_2000_journals``: three brokers (zones a, a, b; a shared ``file:///`` store
  root, a spool dir each), a spec tree of 2,000 journals of replication 3 applied with ONE
  ``gazctl journals apply -f FILE`` process (with ``--max-txn-size 128`` once gazctl has
  that flag; while gazctl refuses more than 128 changes, the client's Apply in batches of
  128 instead: ``converge_apply_2000_journals`` says which); seconds from the start of
  that apply until every journal took an append (small appends from this process through
  the three brokers in turn, at most `APPEND_CONCURRENCY` in flight, each given up after
  `APPEND_TIMEOUT` s, the refused ones tried again; a journal counts once one append
  succeeded). Null if some journal still refused after `CONVERGE_TIMEOUT` s
  (``converge_refused_2000_journals`` counts them, ``converge_refusals_2000_journals``
  says why).
- ``idle_cpu_2000_journals``: then, once every journal has a consistent route in etcd,
  every broker's keyspace has caught up with etcd and their CPU is steady, each broker's
  CPU share over `IDLE_WINDOW` s with nothing happening (``/proc/<pid>/stat`` utime +
  stime over wall seconds); the largest of the three, and all three as
  ``idle_cpu_2000_journals_each``. Null when the journals did not converge.
- ``sync_ms_per_event_10k_journals``: a fresh cluster of three brokers, 10,000 journals of
  replication 1 (written straight to etcd in transactions of 128, which is not what is
  measured). Once every journal has its assignment with the route announced in it (its
  primary opened the replica and synced it), every broker's keyspace has caught up with
  etcd and their CPU is steady (all within `SETTLE_TIMEOUT` s, else null): each broker's
  idle CPU rate over `IDLE_WINDOW` s, then `SYNC_EVENTS` single etcd changes at
  `SYNC_RATE`/s (each a label change of one journal's spec, applied alone and guarded by
  its mod revision: one etcd event, no assignment moves), until the brokers are back to
  their idle rate and have all applied the last change; (CPU seconds in that window -
  idle rate x window) / events, in ms, for the broker that spent the most
  (``sync_ms_per_event_10k_journals_each``: all three). Three brokers, because that is a
  cluster: an event costs each its sync and its allocator's read of the state, and the
  leader its solve too, so the three figures tell the leader from the others.
  Replication 1, so 10,000 journals are ~3,333 replicas a broker (each sync still looks
  at all 10,000 specs) with no replication sessions, and settling stays as cheap as it
  can. The changes go to etcd directly rather than through a broker's Apply RPC, so that
  the RPC's own cost does not land on one broker and count as the event's.

Also in the JSON: how long each step took (``scale_phases_s``), the brokers' CPU seconds
meanwhile, how far behind etcd the brokers' keyspaces fell (``*_keyspace_lag*``, in etcd
revisions: a List of a journal that does not exist answers at the broker's revision),
the settling progress every 30 s (``settle_progress_10k``: seconds, journals assigned,
announced, the largest lag), and brokers that exited or lost their lease
(``broker_troubles_*``, with their first ERROR line). Progress lines on stderr add the
machine's CPU pressure (`/proc/pressure/cpu`): on a 2-core machine shared with other
work the figures are noisy, and that says how much.

Brokers run with ``--broker.limit`` `BROKER_LIMIT` (the default, 1,024 journals a
broker, would leave most of these journals without their replicas), a short drain
timeout (they are stopped together: nothing could take their journals), and
``--log.level info`` into ``<temp dir>/scale-*/broker-*.log`` (``--keep`` keeps them).
Specs set ``refresh_interval: 1h``, so that the periodic listing of every journal's store
(5 min by default) does not land in a measurement window by chance.

Run with ``broker_bench.py --only scale [--keep]``, or this file alone
(``scale_bench.py [--phases converge,sync] [--keep] [--settle-timeout SECONDS]``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, BinaryIO

# Brokers and gazctl are spawned from a process with live gRPC threads (see broker_bench).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import uvloop
from bench_broker import TUNABLES  # type: ignore[import-not-found]

from gazette.allocator import assignments_from, route_of
from gazette.client import BrokerError, JournalClient, RetryPolicy
from gazette.keyspace import MAX_TXN_OPS, Decoder, Etcd, KeySpace, KeyValue, Layout, apply_changes
from gazette.labels import LabelSet
from gazette.local import EmbeddedEtcd, free_port, log_tail
from gazette.protocol import JournalSpec, SpecChange, journal_changes_from_yaml

CONVERGE_PREFIX = "/gazette/bench-scale-2k"
CONVERGE_JOURNALS, CONVERGE_REPLICATION = 2000, 3
CONVERGE_TIMEOUT = 300.0
#: Appends in flight while polling, each given up after APPEND_TIMEOUT s (a primary
#: whose pipeline cannot be synced holds an append up to 10 s; so a pass over 2,000 such
#: journals takes at most 2,000 / 256 x 5 s); a refused one is tried again after
#: APPEND_RETRY_DELAY s.
APPEND_CONCURRENCY, APPEND_RETRY_DELAY, APPEND_TIMEOUT = 256, 0.25, 5.0
SYNC_PREFIX = "/gazette/bench-scale-10k"
SYNC_JOURNALS = 10_000
SYNC_EVENTS, SYNC_RATE = 200, 20.0
#: Bound on waiting for the 10,000 journals to be assigned and announced.
SETTLE_TIMEOUT = 300.0
#: Bound on waiting for consistent routes (2,000 journals) and for steady CPU.
CONSISTENT_TIMEOUT, STEADY_TIMEOUT, STEADY_WINDOW = 120.0, 60.0, 2.0
IDLE_WINDOW = 10.0
#: Bound on waiting, after the last change, for every broker to apply it.
EVENTS_TAIL_TIMEOUT = 600.0
BROKER_LIMIT = 10_000
ZONES = ("zone-a", "zone-a", "zone-b")
#: What the specs share: a file store, and no periodic store listing within a run.
FRAGMENT_YAML = """fragment:
  stores: ["file:///"]
  refresh_interval: 1h"""

CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- CPU accounting --------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, all threads) process `pid` has used so far; NaN once
    it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except (FileNotFoundError, ProcessLookupError):
        return math.nan
    # After "pid (comm) ": state is field 3; utime and stime are fields 14 and 15.
    fields = stat[stat.rindex(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


@dataclasses.dataclass(frozen=True)
class CpuSample:
    """CPU seconds of some processes at a wall-clock instant."""

    wall: float
    cpu: tuple[float, ...]


def sample_cpu(pids: Sequence[int]) -> CpuSample:
    return CpuSample(time.monotonic(), tuple(cpu_seconds(pid) for pid in pids))


def cpu_used(a: CpuSample, b: CpuSample) -> list[float]:
    """CPU seconds each process used from `a` to `b`."""
    return [y - x for x, y in zip(a.cpu, b.cpu, strict=True)]


def cpu_shares(a: CpuSample, b: CpuSample) -> list[float]:
    """Each process's CPU share (CPU seconds per wall second) from `a` to `b`."""
    return [used / (b.wall - a.wall) for used in cpu_used(a, b)]


async def measure_shares(pids: Sequence[int], seconds: float) -> list[float]:
    """Each process's CPU share over the next `seconds`."""
    start = sample_cpu(pids)
    await asyncio.sleep(seconds)
    return cpu_shares(start, sample_cpu(pids))


def rounded(values: Sequence[float], digits: int) -> list[float | None]:
    """`values` rounded for JSON (NaN, from a process that is gone, as null)."""
    return [None if math.isnan(v) else round(v, digits) for v in values]


def fmt_shares(shares: Sequence[float]) -> str:
    return ", ".join(f"{s:.1%}" for s in shares)


async def wait_steady(pids: Sequence[int], what: str, timeout: float = STEADY_TIMEOUT
                      ) -> list[float]:
    """Wait until two consecutive windows of `STEADY_WINDOW` s give each process about
    the same CPU share (within 2 points or 20 %); the last shares. Bounded by `timeout`
    (then logged and returned as they are)."""
    start = time.monotonic()
    prev = await measure_shares(pids, STEADY_WINDOW)
    while True:
        cur = await measure_shares(pids, STEADY_WINDOW)
        if all(abs(c - p) <= max(0.02, 0.2 * p) for c, p in zip(cur, prev, strict=True)):
            log(f"{what}: CPU steady after {time.monotonic() - start:.1f} s "
                f"({fmt_shares(cur)})")
            return cur
        if time.monotonic() - start > timeout:
            log(f"{what}: CPU still not steady after {timeout:.0f} s ({fmt_shares(prev)} "
                f"then {fmt_shares(cur)}); going on")
            return cur
        prev = cur


# -- a cluster of brokers --------------------------------------------------------------


@dataclasses.dataclass
class Broker:
    """One `gazette serve` process of a benchmark cluster."""

    address: str
    proc: asyncio.subprocess.Process
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid


def open_log(path: Path) -> BinaryIO:
    """`path` opened for writing, its folder made first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "wb")


@contextlib.asynccontextmanager
async def brokers_running(etcd_endpoint: str, root: Path, prefix: str
                          ) -> AsyncIterator[list[Broker]]:
    """Three brokers (zones a, a, b) under etcd `prefix`, files under `root`; stopped
    with SIGTERM (then SIGKILL after a minute) on the way out, whatever happens."""
    env = dict(os.environ, GLIBC_TUNABLES=TUNABLES)
    brokers: list[Broker] = []
    try:
        for i, zone in enumerate(ZONES):
            port = free_port()
            log_path = root / f"broker-{i}.log"
            with await asyncio.to_thread(open_log, log_path) as out:  # the child has its own
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "gazette_broker", "serve",
                    "--broker.port", str(port), "--broker.http-port", "-1",
                    "--broker.host", "127.0.0.1", "--broker.zone", zone,
                    "--broker.id", f"scale-{i}", "--broker.limit", str(BROKER_LIMIT),
                    "--broker.drain-timeout", "1", "--broker.file-root", str(root / "store"),
                    "--broker.spool-dir", str(root / f"spools-{i}"),
                    "--etcd.address", etcd_endpoint, "--etcd.prefix", prefix,
                    "--log.level", "info", env=env, stdin=asyncio.subprocess.DEVNULL,
                    stdout=out, stderr=out)
            brokers.append(Broker(f"127.0.0.1:{port}", proc, log_path))
        yield brokers
    finally:
        await stop_brokers(brokers)


async def stop_brokers(brokers: Sequence[Broker]) -> None:
    """SIGTERM each broker still running, wait for them (a minute at most), SIGKILL
    whatever is left. Safe to call twice."""
    for b in brokers:
        if b.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                b.proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(60):
            await asyncio.gather(*(b.proc.wait() for b in brokers))
    for b in brokers:
        if b.proc.returncode is None:
            log(f"broker {b.address} did not stop in 60 s: SIGKILL")
            with contextlib.suppress(ProcessLookupError):
                b.proc.kill()
            await b.proc.wait()


def check_alive(brokers: Sequence[Broker]) -> None:
    for b in brokers:
        if b.proc.returncode is not None:
            raise RuntimeError(f"broker {b.address} exited ({b.proc.returncode}); its log "
                               f"{b.log_path} ends:\n{log_tail(b.log_path)}")


def error_lines(path: Path) -> list[str]:
    """The ERROR lines of a broker's log."""
    with open(path, errors="replace") as fh:
        return [line.rstrip() for line in fh if " ERROR " in line]


async def troubles(brokers: Sequence[Broker]) -> list[str]:
    """Brokers that exited or are stopping (e.g. their lease was lost: their event loop
    was blocked for longer than the lease TTL), with their first ERROR line."""
    out = []
    for b in brokers:
        errors = await asyncio.to_thread(error_lines, b.log_path)
        if b.proc.returncode is not None or any("stopping" in e for e in errors):
            state = "running" if b.proc.returncode is None else f"exit {b.proc.returncode}"
            out.append(f"{b.log_path.name} ({b.address}, {state}): "
                       f"{errors[0] if errors else 'no ERROR line'}")
    return out


def cpu_pressure() -> str:
    """The machine's CPU pressure ("some" over 10 s: the share of time some process,
    the brokers included, waited for a CPU): near 100 %, the figures are bound by CPU
    contention (ours and whatever else runs on the machine)."""
    try:
        with open("/proc/pressure/cpu") as fh:
            some = fh.readline().split()
        return some[1].removeprefix("avg10=") + " %"
    except (OSError, IndexError):
        return "n/a"


async def wait_members(keyspace: KeySpace[Any], layout: Layout,
                       brokers: Sequence[Broker]) -> None:
    deadline = time.monotonic() + 60
    while len(keyspace.prefixed(layout.members)) < len(brokers):
        check_alive(brokers)
        if time.monotonic() > deadline:
            raise RuntimeError("the brokers did not announce themselves in 60 s")
        await asyncio.sleep(0.1)


def route_progress(keyspace: KeySpace[Any], layout: Layout, replication: int
                   ) -> tuple[int, int]:
    """(journals with `replication` assignments and a primary, those of them whose
    every assignment holds the current route: the primary synced them and announced)."""
    prefix = layout.assignments
    by_item: dict[str, list[KeyValue]] = collections.defaultdict(list)
    for entry in keyspace.prefixed(prefix):
        by_item[entry.kv.key[len(prefix):].rsplit("#", 3)[0]].append(entry.kv)
    full = consistent = 0
    for item, kvs in by_item.items():
        assigned = assignments_from(layout, item, kvs)
        route = route_of(assigned)
        if len(assigned) != replication or route.primary < 0:
            continue
        full += 1
        value = route.encode()
        consistent += all(a.value == value for a in assigned)
    return full, consistent


class LagProbe:
    """How far each broker's view of etcd is behind etcd: the revision a List answers
    at (a cheap one: a name that does not exist) against this process's own keyspace,
    which follows the same prefix. Brokers that fall minutes behind are busy with the
    events they already got."""

    def __init__(self, brokers: Sequence[Broker], keyspace: KeySpace[Any]) -> None:
        self.keyspace = keyspace
        self.clients = [JournalClient(b.address, retry=RetryPolicy(attempts=1), timeout=10)
                        for b in brokers]
        self.most = 0

    async def lags(self) -> list[int | None]:
        async def one(client: JournalClient) -> int | None:
            try:
                return (await client.list("name=bench/no-such-journal")).revision
            except Exception:  # noqa: BLE001 - a broker too busy or gone
                return None

        etcd = self.keyspace.revision
        revisions = await asyncio.gather(*(one(c) for c in self.clients))
        lags = [None if r is None else max(0, etcd - r) for r in revisions]
        self.most = max([self.most, *(lag for lag in lags if lag is not None)])
        return lags

    async def describe(self) -> str:
        lags = await self.lags()
        return "brokers' keyspaces behind etcd by " + ", ".join(
            "?" if lag is None else str(lag) for lag in lags) + " revisions"

    async def caught_up(self, timeout: float, what: str) -> bool:
        """Wait (at most `timeout` s) until every broker has applied all of etcd's
        revisions that this process has seen; whether they did."""
        start = time.monotonic()
        while True:
            lags = await self.lags()
            if all(lag == 0 for lag in lags):
                log(f"{what}: every broker caught up with etcd after "
                    f"{time.monotonic() - start:.1f} s")
                return True
            if time.monotonic() - start > timeout:
                log(f"{what}: brokers still behind etcd by "
                    f"{', '.join(map(str, lags))} revisions after {timeout:.0f} s")
                return False
            await asyncio.sleep(1)

    async def __aenter__(self) -> LagProbe:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.gather(*(c.close() for c in self.clients), return_exceptions=True)


# -- converge: 2,000 journals of replication 3 -----------------------------------------


def spec_tree(prefix: str, names: Sequence[str], replication: int) -> str:
    return (f"name: {prefix}\nreplication: {replication}\n{FRAGMENT_YAML}\nchildren:\n"
            + "".join(f"  - name: {name}\n" for name in names))


async def run_gazctl(*args: str, timeout: float = 300.0) -> tuple[int, str]:
    """Run ``gazctl ARGS`` as a process: (exit status, stdout + stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gazette.gazctl", *args, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        async with asyncio.timeout(timeout):
            out, _ = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace").strip()


async def apply_journals(path: Path, address: str, phases: dict[str, float]
                         ) -> tuple[float, str]:
    """Apply the spec tree at `path` with one ``gazctl journals apply -f`` (with
    ``--max-txn-size 128`` if gazctl has that flag). If gazctl refuses more changes than
    one etcd transaction takes, fall back to the client's Apply in batches of 128.
    Returns (when the apply that did it started, how it was applied)."""
    _, usage = await run_gazctl("journals", "apply", "--help", timeout=60)
    args = ["journals", "apply", "-f", str(path), "--broker", address]
    method = "gazctl journals apply -f"
    if "--max-txn-size" in usage:
        args += ["--max-txn-size", str(MAX_TXN_OPS)]
        method += f" --max-txn-size {MAX_TXN_OPS}"
    started = time.monotonic()
    status, out = await run_gazctl(*args)
    phases["apply_gazctl_2k"] = round(time.monotonic() - started, 2)
    if status == 0:
        log(f"applied {path.name} with `{method}` in {phases['apply_gazctl_2k']:.2f} s")
        return started, method
    if "exceed" not in out:
        raise RuntimeError(f"gazctl journals apply failed ({status}): {out}")
    log(f"gazctl refused the apply in {phases['apply_gazctl_2k']:.2f} s ({out.splitlines()[-1]})"
        f"; applying in batches of {MAX_TXN_OPS} through the client instead")
    changes = journal_changes_from_yaml(await asyncio.to_thread(path.read_text))
    started = time.monotonic()
    async with JournalClient(address) as client:
        for i in range(0, len(changes), MAX_TXN_OPS):
            await client.apply(changes[i:i + MAX_TXN_OPS])
    phases["apply_batches_2k"] = round(time.monotonic() - started, 2)
    log(f"applied {len(changes)} specs in batches of {MAX_TXN_OPS} in "
        f"{phases['apply_batches_2k']:.2f} s")
    return started, f"JournalClient.apply in batches of {MAX_TXN_OPS} (gazctl refused)"


async def append_to_all(addresses: Sequence[str], journals: Sequence[str], started: float,
                        deadline: float, status: Callable[[], Awaitable[str]] | None = None
                        ) -> tuple[float | None, dict[str, str]]:
    """Append a small record to every journal, through the brokers in turn, until each
    took one or `deadline` passes (`status()` is added to the progress lines). Returns
    (seconds from `started` until the last journal took its append, or None if some
    never did; journal -> why it was last refused, for those that never took one)."""
    pending = set(journals)
    refused: dict[str, str] = {}
    last_ok = [started]
    gate = asyncio.Semaphore(APPEND_CONCURRENCY)
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(
            JournalClient(a, retry=RetryPolicy(attempts=1), timeout=APPEND_TIMEOUT))
            for a in addresses]

        async def one(i: int, journal: str) -> None:
            while True:
                async with gate:
                    if time.monotonic() >= deadline:
                        return
                    try:
                        async with asyncio.timeout(APPEND_TIMEOUT):
                            await clients[i % len(clients)].append(journal, b"scale\n")
                    except BrokerError as err:
                        refused[journal] = err.status
                    except Exception as err:  # noqa: BLE001 - anything else: try again
                        refused[journal] = type(err).__name__
                    else:
                        pending.discard(journal)
                        refused.pop(journal, None)
                        last_ok[0] = max(last_ok[0], time.monotonic())
                        return
                i += 1  # the next try goes through the next broker
                await asyncio.sleep(APPEND_RETRY_DELAY)

        async def progress() -> None:
            while True:
                await asyncio.sleep(5)
                reasons = collections.Counter(refused[j] for j in pending if j in refused)
                more = await status() if status is not None else ""
                log(f"  {time.monotonic() - started:6.1f} s: {len(journals) - len(pending)}"
                    f"/{len(journals)} journals took an append; last refusals of the "
                    f"others: {dict(reasons.most_common(4))}{more}; machine CPU "
                    f"pressure {cpu_pressure()}")

        reporter = asyncio.create_task(progress())
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(deadline - time.monotonic() + APPEND_TIMEOUT):
                    await asyncio.gather(*(one(i, j) for i, j in enumerate(journals)))
        finally:
            reporter.cancel()
            await asyncio.gather(reporter, return_exceptions=True)
    if pending:
        return None, {j: refused.get(j, "not tried") for j in pending}
    return last_ok[0] - started, {}


async def bench_converge(etcd_endpoint: str, workdir: Path, phases: dict[str, float]
                         ) -> dict[str, object]:
    root = workdir / "scale-2k"
    layout = Layout(CONVERGE_PREFIX)
    names = [f"scale/j-{i:04d}" for i in range(CONVERGE_JOURNALS)]
    t = time.monotonic()
    async with brokers_running(etcd_endpoint, root, CONVERGE_PREFIX) as brokers, \
            Etcd(etcd_endpoint) as etcd, \
            KeySpace(etcd, layout.root + "/", Decoder(layout)) as keyspace, \
            LagProbe(brokers, keyspace) as probe:
        pids = [b.pid for b in brokers]
        log(f"scale ({CONVERGE_JOURNALS:,} journals): brokers "
            f"{', '.join(b.address for b in brokers)}, pids {pids}, logs in {root}")
        await wait_members(keyspace, layout, brokers)
        phases["start_brokers_2k"] = round(time.monotonic() - t, 2)
        log(f"brokers up in {phases['start_brokers_2k']:.2f} s")
        path = root / "journals.yaml"
        await asyncio.to_thread(path.write_text,
                                spec_tree("scale/", names, CONVERGE_REPLICATION))

        cpu0 = last = sample_cpu(pids)
        client0 = time.process_time()
        # Each broker's CPU seconds at its last sample while it ran (a broker that exits
        # takes its counters with it).
        alive_cpu = list(cpu0.cpu)
        started, method = await apply_journals(path, brokers[0].address, phases)

        def sample() -> list[float]:
            nonlocal last
            now = sample_cpu(pids)
            for i, c in enumerate(now.cpu):
                if not math.isnan(c):
                    alive_cpu[i] = c
            shares, last = cpu_shares(last, now), now
            return shares

        async def status() -> str:
            full, consistent = route_progress(keyspace, layout, CONVERGE_REPLICATION)
            return (f"; in etcd {full} fully assigned, {consistent} consistent; broker "
                    f"CPU {fmt_shares(sample())}; {await probe.describe()}")

        converge_s, never = await append_to_all(
            [b.address for b in brokers], names, started, started + CONVERGE_TIMEOUT, status)
        done = time.monotonic()
        phases["converge_2k"] = round(done - started, 2)
        sample()
        used = [a - b for a, b in zip(alive_cpu, cpu0.cpu, strict=True)]
        client_cpu = time.process_time() - client0
        log(f"CPU s from the apply to the end of the appends: brokers "
            f"{', '.join(f'{u:.1f}' for u in used)}, this process (the appends) "
            f"{client_cpu:.1f}")
        trouble = await troubles(brokers)
        for line in trouble:
            log(f"broker in trouble: {line}")
        if converge_s is None:
            reasons = collections.Counter(never.values())
            log(f"gave up after {CONVERGE_TIMEOUT:.0f} s: {len(never)} journals never took "
                f"an append ({dict(reasons)})")
        else:
            log(f"every journal took an append {converge_s:.2f} s after the apply "
                f"started; brokers used {', '.join(f'{u:.1f}' for u in used)} CPU s")

        out: dict[str, object] = {
            "converge_s_2000_journals": None if converge_s is None else round(converge_s, 2),
            "converge_refused_2000_journals": len(never),
            "converge_refusals_2000_journals": dict(collections.Counter(never.values())),
            "converge_apply_2000_journals": method,
            "converge_broker_cpu_s_2000_journals": rounded(used, 1),
            "converge_client_cpu_s_2000_journals": round(client_cpu, 1),
            "converge_max_keyspace_lag_2000_journals": probe.most,
            "idle_cpu_2000_journals": None,
            "idle_cpu_2000_journals_each": None,
            "broker_troubles_2000_journals": trouble,
        }
        if converge_s is None or trouble:
            # Not settled: no idle figure; what the brokers do meanwhile, for the record.
            busy = await measure_shares(pids, IDLE_WINDOW)
            full, consistent = route_progress(keyspace, layout, CONVERGE_REPLICATION)
            log(f"when giving up: {full} journals fully assigned, {consistent} with a "
                f"consistent route; broker CPU over {IDLE_WINDOW:.0f} s: {fmt_shares(busy)}")
            out["consistent_routes_2000_journals"] = consistent
            out["cpu_at_give_up_2000_journals_each"] = rounded(busy, 4)
        else:
            t = time.monotonic()
            deadline = t + CONSISTENT_TIMEOUT
            while True:
                full, consistent = route_progress(keyspace, layout, CONVERGE_REPLICATION)
                if consistent >= CONVERGE_JOURNALS or time.monotonic() > deadline:
                    break
                await asyncio.sleep(1)
            phases["consistent_2k"] = round(time.monotonic() - t, 2)
            log(f"{full} journals fully assigned, {consistent} with a consistent route "
                f"({phases['consistent_2k']:.2f} s after the appends)")
            out["consistent_routes_2000_journals"] = consistent
            t = time.monotonic()
            await probe.caught_up(CONSISTENT_TIMEOUT, f"{CONVERGE_JOURNALS:,} journals")
            phases["caught_up_2k"] = round(time.monotonic() - t, 2)
            t = time.monotonic()
            await wait_steady(pids, f"{CONVERGE_JOURNALS:,} journals")
            phases["steady_2k"] = round(time.monotonic() - t, 2)
            idle = await measure_shares(pids, IDLE_WINDOW)
            phases["idle_window_2k"] = IDLE_WINDOW
            log(f"idle CPU with {CONVERGE_JOURNALS:,} journals over {IDLE_WINDOW:.0f} s: "
                f"{fmt_shares(idle)}")
            out["idle_cpu_2000_journals"] = round(max(idle), 4)
            out["idle_cpu_2000_journals_each"] = [round(s, 4) for s in idle]
            out["broker_troubles_2000_journals"] = await troubles(brokers)
        t = time.monotonic()
    phases["stop_brokers_2k"] = round(time.monotonic() - t, 2)
    log(f"brokers stopped in {phases['stop_brokers_2k']:.2f} s")
    return out


# -- sync cost per event: 10,000 journals of replication 1 -----------------------------


async def bench_sync(etcd_endpoint: str, workdir: Path, phases: dict[str, float],
                     settle_timeout: float = SETTLE_TIMEOUT) -> dict[str, object]:
    root = workdir / "scale-10k"
    layout = Layout(SYNC_PREFIX)
    names = [f"scale10k/j-{i:05d}" for i in range(SYNC_JOURNALS)]
    t = time.monotonic()
    out: dict[str, object] = {"sync_ms_per_event_10k_journals": None,
                              "sync_ms_per_event_10k_journals_each": None}
    async with brokers_running(etcd_endpoint, root, SYNC_PREFIX) as brokers, \
            Etcd(etcd_endpoint) as etcd, \
            KeySpace(etcd, layout.root + "/", Decoder(layout)) as keyspace, \
            LagProbe(brokers, keyspace) as probe:
        pids = [b.pid for b in brokers]
        log(f"scale ({SYNC_JOURNALS:,} journals): brokers {', '.join(b.address for b in brokers)}, "
            f"pids {pids}, logs in {root}")
        await wait_members(keyspace, layout, brokers)
        phases["start_brokers_10k"] = round(time.monotonic() - t, 2)
        log(f"brokers up in {phases['start_brokers_10k']:.2f} s")

        cpu0 = sample_cpu(pids)
        t = time.monotonic()
        changes = journal_changes_from_yaml(spec_tree("scale10k/", names, 1))
        for i in range(0, len(changes), MAX_TXN_OPS):
            await apply_changes(etcd, layout, changes[i:i + MAX_TXN_OPS])
        phases["apply_10k"] = round(time.monotonic() - t, 2)
        log(f"applied {SYNC_JOURNALS:,} specs to etcd in {phases['apply_10k']:.2f} s")

        t = time.monotonic()
        last = sample_cpu(pids)
        # (s, journals assigned, announced, the most any broker's keyspace was behind)
        progress: list[tuple[float, int, int, int | None]] = []
        while True:
            await asyncio.sleep(5)
            full, consistent = route_progress(keyspace, layout, 1)
            now = sample_cpu(pids)
            lags = await probe.lags()
            progress.append((round(now.wall - t, 1), full, consistent,
                             max((lag for lag in lags if lag is not None), default=None)))
            log(f"  {now.wall - t:6.1f} s: {full} journals assigned, {consistent} "
                f"announced; broker CPU {fmt_shares(cpu_shares(last, now))}; keyspaces "
                f"behind etcd by {', '.join(map(str, lags))} revisions; machine CPU "
                f"pressure {cpu_pressure()}")
            last = now
            trouble = await troubles(brokers)
            if consistent >= SYNC_JOURNALS or now.wall - t > settle_timeout or trouble:
                break
        phases["settle_10k"] = round(time.monotonic() - t, 2)
        settle_cpu = cpu_used(cpu0, sample_cpu(pids))
        out["settle_s_10k_journals"] = phases["settle_10k"]
        out["settle_broker_cpu_s_10k_journals"] = rounded(settle_cpu, 1)
        out["settled_journals_10k"] = consistent
        # Every 30 s: (seconds, journals assigned, journals announced, the most a
        # broker's keyspace was behind etcd, in revisions).
        out["settle_progress_10k"] = progress[5::6]
        out["settle_max_keyspace_lag_10k"] = probe.most
        out["broker_troubles_10k_journals"] = trouble
        for line in trouble:
            log(f"broker in trouble: {line}")
        if consistent < SYNC_JOURNALS or trouble:
            log(f"{SYNC_JOURNALS:,} journals did not settle in {phases['settle_10k']:.0f} s "
                f"({full} assigned, {consistent} announced); no per-event figure")
            t = time.monotonic()
            await stop_brokers(brokers)
            phases["stop_brokers_10k"] = round(time.monotonic() - t, 2)
            return out
        log(f"{SYNC_JOURNALS:,} journals assigned and announced {phases['settle_10k']:.1f} s"
            f" after the apply finished; brokers used "
            f"{', '.join(f'{u:.1f}' for u in settle_cpu)} CPU s since the apply started")
        t = time.monotonic()
        await probe.caught_up(max(60.0, settle_timeout - phases["settle_10k"]),
                              f"{SYNC_JOURNALS:,} journals")
        phases["caught_up_10k"] = round(time.monotonic() - t, 2)

        t = time.monotonic()
        await wait_steady(pids, f"{SYNC_JOURNALS:,} journals")
        phases["steady_10k"] = round(time.monotonic() - t, 2)
        idle = await measure_shares(pids, IDLE_WINDOW)
        phases["idle_window_10k"] = IDLE_WINDOW
        log(f"idle CPU with {SYNC_JOURNALS:,} journals over {IDLE_WINDOW:.0f} s: "
            f"{fmt_shares(idle)}")

        # One journal in every SYNC_JOURNALS / SYNC_EVENTS, so that each broker holds
        # some of the changed journals.
        changed = names[::SYNC_JOURNALS // SYNC_EVENTS][:SYNC_EVENTS]
        start, last_revision = sample_cpu(pids), 0
        for k, name in enumerate(changed):
            wait = start.wall + k / SYNC_RATE - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            entry = keyspace.get(layout.item_key(name))
            assert entry is not None and isinstance(entry.value, JournalSpec)
            spec = dataclasses.replace(entry.value, labels=LabelSet([("bench-tick", str(k))]))
            last_revision = await apply_changes(
                etcd, layout, [SpecChange(name, entry.kv.mod_revision, spec)])
        sent = time.monotonic()
        phases["events_10k"] = round(sent - start.wall, 2)
        await keyspace.wait_for_revision(last_revision)  # what the brokers' are held to
        # The window ends once every broker's CPU is back at about its idle rate and it
        # has applied the last change. A List (which says how far a broker got) costs the
        # broker a scan of every spec, so it is asked only when the CPU is quiet, or
        # every 10 s; after each 1 s step's end is sampled. On a machine too noisy for
        # the CPU to look quiet, the window ends 10 s after every change was applied.
        applied_at: float | None = None
        asked_at, back_to_idle = 0.0, False
        while True:
            shares = await measure_shares(pids, 1.0)
            end = sample_cpu(pids)
            quiet = all(s <= i + max(0.03, 0.5 * i) for s, i in zip(shares, idle, strict=True))
            if applied_at is None and (quiet or end.wall - asked_at >= 10):
                asked_at = end.wall
                if all(lag == 0 for lag in await probe.lags()):
                    applied_at = end.wall
            if applied_at is not None and (quiet or end.wall - applied_at >= 10):
                back_to_idle = quiet
                break
            if end.wall - sent > EVENTS_TAIL_TIMEOUT:
                log(f"brokers {'not back to idle' if applied_at else 'still behind'} "
                    f"{EVENTS_TAIL_TIMEOUT:.0f} s after the last change "
                    f"({fmt_shares(shares)}); counting the window as it is")
                break
        phases["events_tail_10k"] = round(end.wall - sent, 2)
        window = end.wall - start.wall
        per_event = [(used - rate * window) / SYNC_EVENTS * 1e3
                     for used, rate in zip(cpu_used(start, end), idle, strict=True)]
        log(f"{SYNC_EVENTS} single spec changes at {SYNC_RATE:.0f}/s: window {window:.1f} s "
            f"(the last change +{end.wall - sent:.1f} s), broker CPU "
            f"{', '.join(f'{u:.2f}' for u in cpu_used(start, end))} s; per event beyond "
            f"idle: {', '.join(f'{ms:.2f}' for ms in per_event)} ms")

        # Did every broker see the last change? (After the window: a List is not free.)
        seen = []
        for b in brokers:
            async with JournalClient(b.address) as client:
                listing = await client.list(f"bench-tick={SYNC_EVENTS - 1}")
                seen.append(len(listing.journals))
        if seen != [1] * len(brokers):
            log(f"warning: brokers list {seen} journals with the last change's label")
        out.update({
            "sync_ms_per_event_10k_journals": None if any(map(math.isnan, per_event))
            else round(max(per_event), 3),
            "sync_ms_per_event_10k_journals_each": rounded(per_event, 3),
            "idle_cpu_10k_journals_each": rounded(idle, 4),
            "sync_events_window_s": round(window, 2),
            "sync_events_all_applied": applied_at is not None,
            "sync_events_back_to_idle": back_to_idle,
            "broker_troubles_10k_journals": await troubles(brokers),
        })
        t = time.monotonic()
    phases["stop_brokers_10k"] = round(time.monotonic() - t, 2)
    log(f"brokers stopped in {phases['stop_brokers_10k']:.2f} s")
    return out


PHASES = ("converge", "sync")


async def bench_scale(etcd_endpoint: str, workdir: Path, phases: Sequence[str] = PHASES,
                      settle_timeout: float = SETTLE_TIMEOUT) -> dict[str, object]:
    """The figures of the parts in `phases`, and ``scale_phases_s``: seconds each step
    took. `settle_timeout`: how long the 10,000 journals may take to settle."""
    times: dict[str, float] = {}
    result: dict[str, object] = {}
    if "converge" in phases:
        result.update(await bench_converge(etcd_endpoint, workdir, times))
    if "sync" in phases:
        result.update(await bench_sync(etcd_endpoint, workdir, times, settle_timeout))
    result["scale_phases_s"] = times
    return result


async def _main(etcd_endpoint: str, workdir: Path, phases: Sequence[str],
                settle_timeout: float) -> dict[str, object]:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await bench_scale(etcd_endpoint, workdir, phases, settle_timeout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phases", default=",".join(PHASES),
                        help=f"comma-separated phases (default: all of {PHASES})")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temp dir (broker logs, etcd data) and print it")
    parser.add_argument("--settle-timeout", type=float, default=SETTLE_TIMEOUT,
                        metavar="SECONDS", help="how long 10,000 journals may take to "
                        f"settle before the per-event figure is given up (default: "
                        f"{SETTLE_TIMEOUT:.0f})")
    args = parser.parse_args()
    phases = args.phases.split(",")
    if not set(phases) <= set(PHASES):
        parser.error(f"--phases: unknown {sorted(set(phases) - set(PHASES))}")
    run_with_etcd("gazette-scale-", args.keep, lambda endpoint, tmp: _main(
        endpoint, tmp, phases, args.settle_timeout))


def run_with_etcd(prefix: str, keep: bool,
                  main: Callable[[str, Path], Coroutine[Any, Any, dict[str, object]]]) -> None:
    """Run `main(etcd endpoint, temp dir)` on uvloop over an etcd of its own in a temp
    dir (kept with `keep`), and print its figures as the last line. Ctrl-C or SIGTERM
    stops every process it started (exit 130)."""

    def run(tmp: Path) -> dict[str, object]:
        with EmbeddedEtcd(tmp / "etcd") as etcd:
            return uvloop.run(main(etcd.endpoint, tmp))

    run_in_temp_dir(prefix, keep, run)


def run_in_temp_dir(prefix: str, keep: bool, run: Callable[[Path], dict[str, object]]
                    ) -> None:
    """`run(temp dir)` (kept with `keep`), its figures printed as the last line; Ctrl-C
    or SIGTERM (which `run` turns into a cancellation) exits 130."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        result = run(tmp)
    except (KeyboardInterrupt, asyncio.CancelledError):
        log("interrupted: every process this benchmark started is stopped")
        sys.exit(130)
    finally:
        if keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
