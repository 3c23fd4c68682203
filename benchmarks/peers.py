"""Ours against its peers: the same workloads against our broker, NATS JetStream and
Redis Streams on this machine, in alternating rounds of one run.

The systems (servers and clients in `peer_targets.py`), each on a free loopback port
with its data under one temp dir:

- ``ours``: etcd and one ``python -m gazette_broker serve`` process with its data path
  on (``--broker.data-port``; ``DATA_PATH=0``: gRPC only), journals of replication 1,
  codec NONE, 64 MiB fragments in a ``file://`` store, a `gazette.client.JournalClient`
  with its defaults (so appends that fit a frame take the data path);
- ``nats``: ``nats-server -js``, one file-storage stream of one subject per workload
  and round, nats-py;
- ``redis``: ``redis-server --appendonly yes --appendfsync everysec --save ""``, one
  stream key per workload and round, ``redis.asyncio`` with hiredis.

The workloads, each after a warm-up, for each system in turn (the order rotates every
round); each figure is the median over the rounds (MB/s figures also with min and max):

- ``*_append_mb_per_s``: 64 KiB payloads to one journal / stream / key with the client's
  best pipelining (ours: `AppendQueue`; NATS: 256 unacknowledged ``publish_async``;
  Redis: two pipelines of 64 XADDs in flight), until 2 GiB or 10 s, whichever comes
  first; ``*_server_cpu_s_per_gb``: the server process' CPU seconds (its
  ``/proc/<pid>/stat``, children it reaped included) from the first timed append until
  the background work they started is done (ours: closed fragments persisted; Redis:
  AOF rewrites finished), per GB appended;
  ``*_client_cpu_s_per_gb``: this process' (``time.process_time``);
- ``*_small_p50_ms`` / ``*_small_p99_ms``: 1 KiB appends, one request each, sent on a
  fixed schedule of 1,000/s for 10 s, latency from the time each was due (so stalls
  count); ``*_small_errors``: appends that failed (left out of the percentiles);
- ``*_read_mb_per_s``: reading back from the start all the append workload wrote;
- ``*_tail_read_mb_per_s``: a reader following the head while another process (this
  script with ``--tail-writer SYSTEM ADDRESS NAME``) appends 64 KiB payloads as the
  append workload does; the reader starts once 256 MiB are written and reads from the
  start until it catches up with the head: its MB/s until then, and
  ``*_tail_writer_mb_per_s``, the writer's meanwhile; it gives up after 60 s or once the
  head passes 3 GiB (``*_tail_caught_up_rounds`` counts the rounds it caught up);
- ``append_vs_best_peer``, ``read_vs_best_peer``, ``tail_vs_best_peer``: ours over the
  better peer; ``p99_vs_best_peer`` and ``cpu_per_gb_vs_best_peer``: ours over the lower
  peer p99 and server CPU per GB;
- ``nats_server_version``, ``redis_server_version``: their ``--version``.

The clients of all three systems share this process (the tail writers aside); it runs
itself again with ``GLIBC_TUNABLES`` as the Makefile sets it (and as the broker gets it)
when that is unset. Between measurements it waits for the background work of the last
one (ours: closed fragments persisted; Redis: an AOF rewrite) and writes dirty pages
back (``sync``). Data goes once read: each round uses new names and deletes the
JetStream streams and Redis keys after use (so Redis never holds more than ~3 GiB),
and Redis then rewrites its AOF, so that each round starts from a small AOF as on a
fresh server and pays the AOF rewrites its 2 GiB of appends cause alike.

``--rounds N`` (default 3), ``--systems ours,nats,redis``, ``--only
append,small,read,tail``, ``--quick`` (about 10x smaller, for development), ``--keep``
(keep the temp dir with the server logs). Progress on stderr; then a markdown table and
what an acknowledgement means for each system on stdout, and one JSON object as the
last line. Stops every process it started on the way out, on Ctrl-C and on SIGTERM.
Needs ``nats-server`` and ``redis-server`` (``scripts/ensure-bench-deps.sh``).
"""

from __future__ import annotations

import os

# The benchmark spawns servers and writers from a process with live gRPC threads;
# grpcio's fork handlers only get in the way of that (see tests/conftest.py).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import argparse
import asyncio
import contextlib
import shutil
import signal
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop
from broker_bench import TUNABLES  # type: ignore[import-not-found]
from peer_servers import (  # type: ignore[import-not-found]
    DATA_PATH_ARGS,
    serve,
    server_cpu_s,
    version,
)
from peer_targets import (  # type: ignore[import-not-found]
    BINARIES,
    PAYLOAD,
    SYSTEMS,
    TITLES,
    Target,
    connect,
    tail_writer,
)
from scale_bench import run_in_temp_dir, run_with_etcd  # type: ignore[import-not-found]

MiB, GiB = 1 << 20, 1 << 30
SMALL_RATE = 1000
WORKLOAD_TIMEOUT = 300.0
WORKLOADS = ("append", "small", "read", "tail")


@dataclass(frozen=True, slots=True)
class Scale:
    """How much each workload does (`QUICK`: about a tenth, for development)."""

    append_bytes: int = 2 * GiB
    append_seconds: float = 10.0
    append_warmup: int = 128 * MiB
    small_seconds: float = 10.0
    small_warmup_seconds: float = 1.0
    read_warmup: int = 64 * MiB
    tail_backlog: int = 256 * MiB
    tail_cap: int = 3 * GiB
    tail_seconds: float = 60.0


QUICK = Scale(append_bytes=205 * MiB, append_seconds=1.0, append_warmup=16 * MiB,
              small_seconds=1.0, small_warmup_seconds=0.2, read_warmup=8 * MiB,
              tail_backlog=32 * MiB, tail_cap=512 * MiB, tail_seconds=15.0)

#: Table rows: label, figure, whether it is MB/s (shown with min-max), decimals.
ROWS = (
    ("append 64 KiB, MB/s", "append_mb_per_s", True, 0),
    ("append: server CPU s/GB", "server_cpu_s_per_gb", False, 2),
    ("append: client CPU s/GB", "client_cpu_s_per_gb", False, 2),
    ("1 KiB at 1,000/s, one request each: p50 ms", "small_p50_ms", False, 2),
    ("1 KiB at 1,000/s, one request each: p99 ms", "small_p99_ms", False, 2),
    ("read from the start, MB/s", "read_mb_per_s", True, 0),
    ("tail: reader MB/s until caught up", "tail_read_mb_per_s", True, 0),
    ("tail: writer MB/s meanwhile", "tail_writer_mb_per_s", True, 0),
)

Figures = dict[str, dict[str, list[float]]]  # system -> figure -> one value a round


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cpu_pressure() -> str:
    """The machine's CPU pressure ("some" avg10), to tell a noisy measurement."""
    try:
        with open("/proc/pressure/cpu") as fh:
            return fh.readline().split()[1].removeprefix("avg10=") + "%"
    except (OSError, IndexError):
        return "?"


async def quiesce(target: Target, name: str) -> None:
    """Let the last workload's background work finish and write dirty pages back, so
    that neither lands in the next measurement."""
    await asyncio.wait_for(target.settle(name), 150)
    try:
        await asyncio.wait_for(asyncio.to_thread(os.sync), 120)
    except TimeoutError:
        log("sync took over 120 s: going on")


async def measure_append(target: Target, pids: dict[str, int], name: str, scale: Scale,
                         fill_only: bool) -> tuple[dict[str, float], int]:
    """The append figures, and how many payloads `name` then holds (warm-up included).
    The server's CPU counts until the background work the appends started is done (its
    `settle`); `pids`: every server's, to report what the others spent meanwhile (they
    should be idle). With `fill_only`, only writes the data the read workload needs."""
    payload = os.urandom(PAYLOAD)
    warm = await target.append_stream(name, payload, scale.append_warmup // PAYLOAD,
                                      float("inf"))
    await quiesce(target, name)
    servers0 = {s: server_cpu_s(p) for s, p in pids.items()}
    client0, start = time.process_time(), time.perf_counter()
    n = await target.append_stream(name, payload, scale.append_bytes // PAYLOAD,
                                   scale.append_seconds)
    elapsed, client_s = time.perf_counter() - start, time.process_time() - client0
    others = {s: server_cpu_s(p) - servers0[s] for s, p in pids.items() if s != target.system}
    await asyncio.wait_for(target.settle(name), 150)
    server_s = server_cpu_s(pids[target.system]) - servers0[target.system]
    gb = n * PAYLOAD / 1e9
    await quiesce(target, name)
    if fill_only:
        return {}, warm + n
    if others:
        log(f"  ({target.system} append: {gb:.2f} GB in {elapsed:.1f} s; the other servers' "
            "CPU meanwhile: " + ", ".join(f"{s} {v:.2f} s" for s, v in others.items()) + ")")
    return {"append_mb_per_s": gb * 1e3 / elapsed, "server_cpu_s_per_gb": server_s / gb,
            "client_cpu_s_per_gb": client_s / gb}, warm + n


async def latencies(append_one: Callable[[], Awaitable[None]], seconds: float
                    ) -> tuple[list[float], list[BaseException]]:
    """Seconds each append took from the time it was due, sent at `SMALL_RATE`/s for
    `seconds` (perf_counter: uvloop's clock only has millisecond resolution), sorted;
    and the errors of those that failed."""
    took: list[float] = []
    errors: list[BaseException] = []
    tasks: set[asyncio.Task[None]] = set()

    async def one(due: float) -> None:
        try:
            await append_one()
        except Exception as exc:  # noqa: BLE001 - counted and reported
            errors.append(exc)
        else:
            took.append(time.perf_counter() - due)

    start = time.perf_counter()
    for i in range(round(SMALL_RATE * seconds)):
        due = start + i / SMALL_RATE
        wait = due - time.perf_counter()
        if wait > 0.0005:
            await asyncio.sleep(wait)  # pacing the schedule
        task = asyncio.create_task(one(due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    async with asyncio.timeout(60):
        await asyncio.gather(*tasks)
    return sorted(took), errors


async def measure_small(target: Target, name: str, scale: Scale) -> dict[str, float]:
    """p50 and p99 of 1 KiB appends at `SMALL_RATE`/s after a warm-up; failed appends
    are left out of them and counted (``small_errors``)."""
    data = b"x" * 1023 + b"\n"

    async def one() -> None:
        await target.append_one(name, data)

    await latencies(one, scale.small_warmup_seconds)
    took, errors = await latencies(one, scale.small_seconds)
    if errors:
        log(f"{target.system}: {len(errors)} of {len(took) + len(errors)} 1 KiB appends "
            f"failed, the first with {errors[0]!r}")
    if len(took) < 100:
        raise RuntimeError(f"{target.system}: only {len(took)} 1 KiB appends succeeded")
    return {"small_p50_ms": statistics.median(took) * 1e3,
            "small_p99_ms": took[int(len(took) * 0.99) - 1] * 1e3,
            "small_errors": float(len(errors))}


async def measure_read(target: Target, name: str, count: int, scale: Scale
                       ) -> dict[str, float]:
    """Read the first `count` payloads of `name` after reading a few as a warm-up."""
    await target.read_range(name, min(count, scale.read_warmup // PAYLOAD))
    start = time.perf_counter()
    got = await target.read_range(name, count)
    elapsed = time.perf_counter() - start
    if got != count * PAYLOAD:
        raise RuntimeError(f"{target.system}: read {got} bytes of {name}, expected "
                           f"{count * PAYLOAD}")
    return {"read_mb_per_s": got / elapsed / 1e6}


async def measure_tail(target: Target, name: str, scale: Scale) -> dict[str, float]:
    """A reader from the start following the head while a writer process appends."""
    await target.create(name)
    writer = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--tail-writer", target.system, target.address, name,
        env=dict(os.environ, GLIBC_TUNABLES=TUNABLES))
    try:
        deadline = time.monotonic() + 60
        while await target.head(name) < scale.tail_backlog:
            if writer.returncode is not None:
                raise RuntimeError(f"{target.system}: the tail writer exited with "
                                   f"{writer.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{target.system}: the tail writer wrote less than "
                                   f"{scale.tail_backlog // MiB} MiB in 60 s")
            await asyncio.sleep(0.02)
        head0, start = await target.head(name), time.perf_counter()
        tail = await target.tail_read(name, scale.tail_cap, scale.tail_seconds)
    finally:
        if writer.returncode is None:
            writer.kill()
        await asyncio.wait_for(writer.wait(), 30)
    elapsed = tail.at - start
    if not tail.caught_up:
        log(f"{target.system}: the tail reader did not catch up (read "
            f"{tail.read_bytes // MiB} MiB in {elapsed:.1f} s, head at {tail.head // MiB} MiB)")
    await target.drop(name)
    await quiesce(target, name)
    return {"tail_read_mb_per_s": tail.read_bytes / elapsed / 1e6,
            "tail_writer_mb_per_s": (tail.head - head0) / elapsed / 1e6,
            "tail_caught_up": float(tail.caught_up)}


async def measure_rounds(targets: dict[str, tuple[Target, int]], rounds: int,
                         only: set[str], scale: Scale) -> Figures:
    """Every workload in `only` for every system, `rounds` times, the order of the
    systems rotating each round."""
    systems = list(targets)
    pids = {s: pid for s, (_, pid) in targets.items()}
    figures: Figures = {s: {} for s in systems}

    def record(system: str, got: dict[str, float], what: str) -> None:
        for key, value in got.items():
            figures[system].setdefault(key, []).append(value)
        shown = ", ".join(f"{k} {v:.2f}" for k, v in got.items())
        log(f"  {system} {what}: {shown} (cpu pressure {cpu_pressure()})")

    for r in range(rounds):
        order = systems[r % len(systems):] + systems[:r % len(systems)]
        log(f"round {r + 1}/{rounds}: {', '.join(order)}")
        counts: dict[str, int] = {}
        async with asyncio.timeout(WORKLOAD_TIMEOUT * 4 * len(order)):
            if only & {"append", "read"}:
                for system in order:
                    target, _ = targets[system]
                    await target.create(f"append-{r}")
                    async with asyncio.timeout(WORKLOAD_TIMEOUT):
                        got, counts[system] = await measure_append(
                            target, pids, f"append-{r}", scale, "append" not in only)
                    if got:
                        record(system, got, "append")
            if "small" in only:
                for system in order:
                    target, _ = targets[system]
                    await target.create(f"small-{r}")
                    async with asyncio.timeout(WORKLOAD_TIMEOUT):
                        record(system, await measure_small(target, f"small-{r}", scale),
                               "1 KiB appends")
            for system in order:  # the read workload, then the append data goes
                target, _ = targets[system]
                if "read" in only:
                    async with asyncio.timeout(WORKLOAD_TIMEOUT):
                        record(system, await measure_read(target, f"append-{r}",
                                                          counts[system], scale), "read")
                if system in counts:
                    await target.drop(f"append-{r}")
                if "small" in only:  # now: Redis rewrites its AOF on a drop
                    await target.drop(f"small-{r}")
            if "tail" in only:
                for system in order:
                    target, _ = targets[system]
                    async with asyncio.timeout(WORKLOAD_TIMEOUT):
                        record(system, await measure_tail(target, f"tail-{r}", scale),
                               "tail")
    return figures


def summary(figures: Figures, rounds: int, quick: bool, versions: dict[str, str]
            ) -> dict[str, object]:
    """The JSON figures: medians over the rounds (MB/s also min and max) and ratios."""
    out: dict[str, object] = {"rounds": rounds, "ours_data_path": bool(DATA_PATH_ARGS)}
    if quick:
        out["quick"] = True
    for system, figs in figures.items():
        for _, key, mb_per_s, decimals in ROWS:
            values = figs.get(key)
            if not values:
                continue
            out[f"{system}_{key}"] = round(statistics.median(values), decimals or None)
            if mb_per_s:
                out[f"{system}_{key}_min"] = round(min(values))
                out[f"{system}_{key}_max"] = round(max(values))
        if "tail_caught_up" in figs:
            out[f"{system}_tail_caught_up_rounds"] = round(sum(figs["tail_caught_up"]))
        if "small_errors" in figs:
            out[f"{system}_small_errors"] = round(sum(figs["small_errors"]))

    def ratio(key: str, best: Callable[[list[float]], float]) -> float | None:
        ours = figures.get("ours", {}).get(key)
        peers = [statistics.median(figs[key]) for s, figs in figures.items()
                 if s != "ours" and figs.get(key)]
        if not ours or not peers or not best(peers):
            return None
        return round(statistics.median(ours) / best(peers), 3)

    out["append_vs_best_peer"] = ratio("append_mb_per_s", max)
    out["p99_vs_best_peer"] = ratio("small_p99_ms", min)
    out["read_vs_best_peer"] = ratio("read_mb_per_s", max)
    out["tail_vs_best_peer"] = ratio("tail_read_mb_per_s", max)
    out["cpu_per_gb_vs_best_peer"] = ratio("server_cpu_s_per_gb", min)
    for system, v in versions.items():
        out[f"{system}_server_version"] = v
    out["cpu_pressure_avg10"] = cpu_pressure()
    return out


def table(figures: Figures, targets: dict[str, Target], rounds: int) -> str:
    """The markdown table (medians; MB/s with min-max) and, per system, what an
    acknowledgement means, the client's window and how it reads."""
    systems = list(figures)
    lines = ["| figure | " + " | ".join(TITLES[s] for s in systems) + " |",
             "|---" * (len(systems) + 1) + "|"]
    for label, key, mb_per_s, decimals in ROWS:
        if not any(figures[s].get(key) for s in systems):
            continue
        cells = []
        for s in systems:
            values = figures[s].get(key)
            if not values:
                cells.append("-")
                continue
            cell = f"{statistics.median(values):.{decimals}f}"
            if mb_per_s and len(values) > 1:
                cell += f" ({min(values):.0f}-{max(values):.0f})"
            caught = figures[s].get("tail_caught_up")
            if key == "tail_read_mb_per_s" and caught and sum(caught) < len(caught):
                cell += f", caught up in {sum(caught):.0f} of {len(caught)}"
            failed = sum(figures[s].get("small_errors") or [0.0])
            if key == "small_p99_ms" and failed:
                cell += f", {failed:.0f} failed"
            cells.append(cell)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"Medians of {rounds} round(s); MB/s figures with min-max in parentheses.")
    for s in systems:
        t = targets[s]
        lines.append("")
        lines.append(f"**{TITLES[s]}**: {t.durability}. Bulk appends: {t.window}. "
                     f"Reads: {t.read_method}.")
    return "\n".join(lines)


async def run(etcd_endpoint: str | None, workdir: Path, systems: list[str],
              only: set[str], rounds: int, scale: Scale) -> dict[str, object]:
    """Start the servers, measure, print the table; the JSON figures. SIGTERM cancels
    it like Ctrl-C does, so every process it started is stopped."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    versions = {s: version(s) for s in systems if s in BINARIES}
    async with contextlib.AsyncExitStack() as stack:
        targets: dict[str, tuple[Target, int]] = {}
        for system in systems:
            server = await stack.enter_async_context(
                serve(system, workdir, etcd_endpoint, TUNABLES))
            target = await connect(system, server.address, etcd_endpoint)
            stack.push_async_callback(target.close)
            targets[system] = (target, server.pid)
            log(f"{system}: server pid {server.pid} at {server.address}"
                + (f" (v{versions[system]})" if system in versions else ""))
        figures = await measure_rounds(targets, rounds, only, scale)
    print(table(figures, {s: t for s, (t, _) in targets.items()}, rounds), flush=True)
    return summary(figures, rounds, scale is QUICK, versions)


def run_without_etcd(main: Callable[[str | None, Path], Coroutine[Any, Any, dict[str, object]]],
                     keep: bool) -> None:
    """As `run_with_etcd`, for runs without ours: no etcd to start."""
    run_in_temp_dir("gazette-peers-", keep, lambda tmp: uvloop.run(main(None, tmp)))


def main() -> None:
    if sys.argv[1:2] == ["--tail-writer"]:
        with contextlib.suppress(KeyboardInterrupt):
            uvloop.run(tail_writer(*sys.argv[2:5]))
        return
    if "GLIBC_TUNABLES" not in os.environ:
        # The clients of all three systems share this process: give it the malloc
        # settings the Makefile gives everything (and the broker gets here), not none.
        log(f"running again with GLIBC_TUNABLES={TUNABLES}")
        os.execve(sys.executable, [sys.executable, *sys.argv],
                  dict(os.environ, GLIBC_TUNABLES=TUNABLES))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of every workload on every system (default 3)")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help=f"comma-separated, of {SYSTEMS}")
    parser.add_argument("--only", default=",".join(WORKLOADS),
                        help=f"comma-separated workloads, of {WORKLOADS}")
    parser.add_argument("--quick", action="store_true", help="about 10x smaller")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temp dir (server logs) and print where it is")
    args = parser.parse_args()
    systems = list(dict.fromkeys(args.systems.split(",")))
    only = set(args.only.split(","))
    if not set(systems) <= set(SYSTEMS):
        parser.error(f"--systems: unknown {sorted(set(systems) - set(SYSTEMS))}")
    if not only <= set(WORKLOADS):
        parser.error(f"--only: unknown workloads {sorted(only - set(WORKLOADS))}")
    if args.rounds < 1:
        parser.error("--rounds: at least 1")
    missing = [BINARIES[s] for s in systems if s in BINARIES and not shutil.which(BINARIES[s])]
    if missing:
        sys.exit(f"{' and '.join(missing)} not found: run scripts/ensure-bench-deps.sh")
    scale = QUICK if args.quick else Scale()

    def measure(etcd_endpoint: str | None, tmp: Path
                ) -> Coroutine[Any, Any, dict[str, object]]:
        return run(etcd_endpoint, tmp, systems, only, args.rounds, scale)

    if "ours" in systems:
        run_with_etcd("gazette-peers-", args.keep, measure)
    else:
        run_without_etcd(measure, args.keep)


if __name__ == "__main__":
    main()
