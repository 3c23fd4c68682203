"""Failover at the default settings, and no failover that should not happen.

etcd and three brokers (zones a, a, b; `broker_bench.start_cluster`, every setting at its
default, the lease TTL included) on this machine, four journals of replication 2.

- Busy phase (``--busy-seconds``, default 600): two processes spinning on both cores at
  the brokers' priority, and a writer appending 64 KiB appends to every journal through
  the brokers all along. Every 0.1 s the benchmark reads the journals' routes and the
  members from its keyspace. ``spurious_failovers``: a journal whose primary changed, or
  a member that disappeared (its lease expired), when nothing was killed; a broker that
  exits counts too. ``busy_cpu``: the machine's CPU use over the phase (1.0 = both cores).
- Failover trials (``--trials``, default 5): a writer appends small appends to one journal
  through a broker that is not its primary; the primary is SIGKILLed; ``failover_s`` is
  the median of the seconds from the kill to the writer's next acknowledged append
  (``failover_s_max``, ``failover_trials``: each). The killed broker is started again and
  the routes settle before the next trial. ``lease_ttl_s``: the brokers' lease TTL, which
  bounds it (a dead member's assignments move once its lease expires).

Prints progress on stderr and one JSON object as its last line. Stops what it started on
the way out, on Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from broker_bench import (  # type: ignore[import-not-found]
    FRAGMENT_YAML,
    TUNABLES,
    cluster_broker_args,
    consistent_route,
    failover_seconds,
    log,
    start_cluster,
)
from scale_bench import run_with_etcd  # type: ignore[import-not-found]

from gazette.client import AppendQueue, JournalClient, RetryPolicy
from gazette.cluster import DEFAULT_LEASE_TTL
from gazette.keyspace import Decoder, Etcd, KeySpace, Layout, apply_changes
from gazette.local import free_port
from gazette.protocol import journal_changes_from_yaml

PREFIX = "/gazette/bench-failover"
JOURNALS = [f"failover/j{i}" for i in range(4)]
SPECS = f"""
name: failover/
replication: 2
{FRAGMENT_YAML}
children:
""" + "".join(f"  - name: {j}\n" for j in JOURNALS)
SPIN = "while True: pass"


class Cluster:
    """The three brokers, started again on a new port after a kill."""

    def __init__(self, etcd: str, workdir: Path) -> None:
        self.etcd, self.workdir = etcd, workdir
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.index: dict[str, int] = {}

    async def start(self) -> None:
        self.procs = await start_cluster(self.etcd, self.workdir, PREFIX)
        self.index = {address: i for i, address in enumerate(self.procs)}

    async def restart(self, address: str) -> None:
        i = self.index.pop(address)
        await self.procs.pop(address).wait()
        port = free_port()
        new = f"127.0.0.1:{port}"
        self.procs[new] = await asyncio.create_subprocess_exec(
            *cluster_broker_args(self.etcd, self.workdir, i, port, PREFIX),
            env=dict(os.environ, GLIBC_TUNABLES=TUNABLES))
        self.index[new] = i

    def exited(self) -> list[str]:
        return [a for a, p in self.procs.items() if p.returncode is not None]

    async def stop(self) -> None:
        for proc in self.procs.values():
            if proc.returncode is None:
                proc.terminate()
        await asyncio.gather(*(asyncio.wait_for(p.wait(), 60) for p in self.procs.values()))


async def settled(keyspace: KeySpace[object], layout: Layout, timeout: float = 90
                  ) -> dict[str, str]:
    """journal -> primary address, once three members are up and every journal's route
    is consistent."""
    deadline = time.monotonic() + timeout
    while True:
        routes = {j: consistent_route(keyspace, layout, j, 2) for j in JOURNALS}
        if len(keyspace.prefixed(layout.members)) == 3 and all(routes.values()):
            return {j: r[0] for j, r in routes.items() if r is not None}
        if time.monotonic() > deadline:
            raise TimeoutError(f"the journals' routes did not settle in {timeout:.0f}s")
        await asyncio.sleep(0.1)


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine."""
    with open("/proc/stat") as fh:
        fields = [float(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


async def busy_phase(cluster: Cluster, keyspace: KeySpace[object], layout: Layout,
                     seconds: float) -> tuple[int, float, list[str]]:
    """(spurious failovers, machine CPU use, what they were) over `seconds` of spinning
    processes and writers."""
    primaries = await settled(keyspace, layout)
    members = {e.key for e in keyspace.prefixed(layout.members)}
    spinners = [await asyncio.create_subprocess_exec(sys.executable, "-c", SPIN)
                for _ in range(2)]
    events: list[str] = []
    stop = asyncio.Event()
    chunk = os.urandom(64 << 10)

    async def write(address: str) -> None:
        retry = RetryPolicy(attempts=1000, initial_delay=0.05, max_delay=1.0)
        async with JournalClient(address, retry=retry) as client:
            queue = AppendQueue(client)
            try:
                while not stop.is_set():
                    futures = [queue.append(j, chunk) for j in JOURNALS for _ in range(8)]
                    await asyncio.gather(*futures)
            finally:
                await queue.close()

    busy0, total0 = cpu_times()
    writers = [asyncio.create_task(write(a)) for a in cluster.procs]
    try:
        end = time.monotonic() + seconds
        next_log = time.monotonic() + 60
        while time.monotonic() < end:
            await asyncio.sleep(0.1)
            for journal, old in primaries.items():
                route = consistent_route(keyspace, layout, journal, 2)
                if route is not None and route[0] != old:
                    events.append(f"{journal}: primary {old} -> {route[0]}")
                    primaries[journal] = route[0]
            now_members = {e.key for e in keyspace.prefixed(layout.members)}
            events += [f"member {m} left" for m in members - now_members]
            members |= now_members
            events += [f"broker {a} exited" for a in cluster.exited()
                       if f"broker {a} exited" not in events]
            if time.monotonic() > next_log:
                next_log += 60
                log(f"busy: {seconds - (end - time.monotonic()):.0f}s, "
                    f"{len(events)} spurious failovers")
        busy1, total1 = cpu_times()
    finally:
        stop.set()
        for spinner in spinners:
            spinner.kill()
        await asyncio.gather(*(s.wait() for s in spinners))
        await asyncio.gather(*writers, return_exceptions=True)
    return len(events), (busy1 - busy0) / (total1 - total0), events


async def failover_trial(cluster: Cluster, keyspace: KeySpace[object], layout: Layout,
                         journal: str) -> float:
    """Seconds from SIGKILL of `journal`'s primary to the next append acknowledged
    through another broker (logging when the lease expired and the route moved); then
    the killed broker is started again."""
    primary = (await settled(keyspace, layout))[journal]
    through = next(a for a in cluster.procs if a != primary)
    steps: dict[str, float] = {}

    def watch(now: float) -> None:
        if len(keyspace.prefixed(layout.members)) < 3:
            steps.setdefault("lease expired", now)
        route = consistent_route(keyspace, layout, journal, 2)
        if route is None:
            steps.setdefault("reassigning", now)
        elif route[0] != primary:
            steps.setdefault("new route acknowledged", now)

    failover = await failover_seconds(through, journal, cluster.procs[primary].kill, watch)
    log("  " + ", ".join(f"{k} at {v:.2f}s" for k, v in steps.items()))
    await cluster.restart(primary)
    return failover


async def run(etcd_endpoint: str, workdir: Path, busy_seconds: float, trials: int
              ) -> dict[str, object]:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    layout = Layout(PREFIX)
    cluster = Cluster(etcd_endpoint, workdir)
    await cluster.start()
    try:
        async with Etcd(etcd_endpoint) as etcd, \
                KeySpace(etcd, layout.root + "/", Decoder(layout)) as keyspace:
            deadline = time.monotonic() + 60
            while len(keyspace.prefixed(layout.members)) < 3:
                assert time.monotonic() < deadline, "the brokers did not start"
                await asyncio.sleep(0.1)
            await apply_changes(etcd, layout, journal_changes_from_yaml(SPECS))
            spurious, busy_cpu, events = 0, 0.0, []
            if busy_seconds > 0:
                log(f"busy phase: {busy_seconds:.0f}s, two spinning processes and writers")
                spurious, busy_cpu, events = await busy_phase(cluster, keyspace, layout,
                                                              busy_seconds)
                log(f"busy phase over: CPU {busy_cpu:.0%}, spurious failovers: {spurious}"
                    + "".join(f"\n  {e}" for e in events))
            times = []
            for i in range(trials):
                times.append(await failover_trial(cluster, keyspace, layout,
                                                  JOURNALS[i % len(JOURNALS)]))
                log(f"failover trial {i + 1}: {times[-1]:.2f}s")
    finally:
        await cluster.stop()
    return {
        "failover_s": round(statistics.median(times), 2) if times else None,
        "failover_s_max": round(max(times), 2) if times else None,
        "failover_trials": [round(t, 2) for t in times],
        "spurious_failovers": spurious,
        "busy_seconds": busy_seconds,
        "busy_cpu": round(busy_cpu, 3),
        "lease_ttl_s": DEFAULT_LEASE_TTL,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy-seconds", type=float, default=600.0,
                        help="length of the busy phase (default 600; 0 skips it)")
    parser.add_argument("--trials", type=int, default=5, help="failover trials (default 5)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = parser.parse_args()
    if args.busy_seconds < 0:
        parser.error("--busy-seconds: 0 or more")
    if args.trials < 1:
        parser.error("--trials: at least 1")
    run_with_etcd("gazette-failover-", args.keep,
                  lambda endpoint, tmp: run(endpoint, tmp, args.busy_seconds, args.trials))


if __name__ == "__main__":
    main()
