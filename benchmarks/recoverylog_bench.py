"""Recovery logs: playback MB/s, what recording costs a SQLite store, and a cold start.

Starts etcd and a broker (its own process; journals of replication 1, 64 MiB
uncompressed fragments in a `file:///` store; by default without its data path, as a
broker's default is: ``DATA_PATH=1`` turns it on, and the recorder's appends take it;
`data_path` in the output says which), then:

- `playback_mb_per_s`: a recovery log of 256 MiB (`playback_bytes`, what the player
  read): one file of a `RecordedFolder` written in writes of 64 KiB to 1 MiB (random
  sizes, one after the other, incompressible bytes), committed every 4 MiB; played from
  its start by a fresh `Player(...).play()` (then `finish()`, the files closed) into an
  empty folder; bytes played over seconds, the median of three plays (the first one's
  file checked byte for byte). Target >= 200 MB/s;
- `recording_overhead`: the same SQLite workload with recording and without, alternated
  over three rounds (medians): transactions of 1,000 `INSERT OR REPLACE` of 100-byte
  values into a table with an integer key plus the checkpoint row, as many
  transactions as the first plain run does in 5 s (after each recorded run, the broker
  is let persist its fragments, which are then deleted). Two workloads: "random" (keys
  in a range that grows by 1,000 a transaction: about half are new, the rest updates
  all over the table: each transaction dirties ~1,000 pages) and "sequential"
  (`..._sequential`: the next 1,000 keys: a few dozen pages). With recording:
  `SQLiteStore(page_size=1024)` on a `RecordedFolder` (a fresh log each round), driven
  as a shard's runner drives it (up to `commits_in_flight` commits under way while the
  next transactions run; a commit ending in a rewrite awaited); without: a plain
  `apsw.Connection` on a local file with the same page size, exclusive locking, WAL,
  synchronous off, 2,000 pages of cache and SQLite's default checkpoints, the
  checkpoint row in the same transaction, COMMIT per transaction. Overhead = with /
  without - 1 (target <= 0.5 random, <= 0.25 sequential); also
  `sqlite_txn_per_s_recorded` / `_plain`, and `recorded_mib_per_txn`, the log bytes one
  transaction cost (its WAL frames, and its share of the rewrites);
- `log_after_prune_vs_db`: a table of 1,000,000 rows (~110 MiB) updated at random
  until 20 times the database was recorded of its WAL (as patches: ~80 times of WAL
  frames; an hour-equivalent of sustained updates), hints kept as a primary keeps
  them, a prune at each hint write: the most a prune kept, over the database's size
  (target <= 3; `_last`: at the end); `log_bound_cold_start_s`: a successor playing
  what the last prune kept (`log_bound_played_mib`) and opening the store;
- `cold_start_s`: a store of ~1 GiB (`cold_start_store_mib`: its database and WAL; 1 KiB
  random rows, 1,000 per transaction, through `SQLiteStore` on its log, 4 KiB pages)
  rebuilt by a fresh member from the hints of its last commit: `Player(client, log,
  root, hints).handoff(author)`, then `SQLiteStore(folder).restore_checkpoint()`
  (`cold_start_log_mib`: the log bytes the player read; `COLD_ROWS` sets the rows);
- `handoff_s`: stream-sum (one shard, its sums in SQLite on a recovery log,
  `hot_standbys: 1`) on two `gazette-consumer serve` processes at their defaults,
  while one-chunk streams are published every 10 ms: from SIGTERM of the primary's
  member to the first sum its successor publishes (the sum's UUID time; the successor
  is told apart by its producer id), the median of `HANDOFF_ROUNDS` (the stopped member
  restarted, caught up as standby, and the next primary stopped); also
  `handoff_pause_s`, the longest any of those streams waited for its sum across a
  hand-off (how long processing paused: the old primary works until its successor is
  ready).

Runs itself (and the broker) with ``GLIBC_TUNABLES`` as the Makefile and the container
image set it (`bench_broker.TUNABLES`): the plain baseline, the recorded store and the
broker all as deployed. Prints progress on stderr and one JSON object as the last line. ``--only
handoff,cold_start`` runs some of the parts (all by default: playback, overhead, bound,
cold_start, handoff); ``ROUNDS=1`` one round of the overhead; ``WORKLOADS=sequential``
one of its workloads.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import apsw
import uvloop
from bench_broker import serving_broker, with_tunables  # type: ignore[import-not-found]

from gazette.client import JournalClient
from gazette.consumer import Checkpoint
from gazette.consumer.sqlite import SQLiteStore
from gazette.keyspace import Decoder, Etcd, KeySpace, Layout
from gazette.local import EmbeddedEtcd, Process, free_port
from gazette.message.uuid import clock_of, producer_of, unix_time_of
from gazette.protocol import ReplicaState
from gazette.recoverylog import Hints, Player, RecordedFolder
from gazette_consumer.examples import stream_sum

MiB = 1 << 20
PLAYBACK_VOLUME, PLAYBACK_COMMIT, PLAYBACK_RUNS = 256 * MiB, 4 * MiB, 3
TXN_ROWS, PLAIN_SECONDS, ROUNDS = 1000, 5.0, int(os.environ.get("ROUNDS", 3))
HANDOFF_ROUNDS = 3
STORE_ROWS, STORE_ROW_BYTES = int(os.environ.get("COLD_ROWS", 800_000)), 1024
#: The log-size phase: a table of BOUND_ROWS rows, updated at random (1,000 rows a
#: transaction) until BOUND_VOLUME times the database was written to the WAL; the
#: primary's hints are taken every BOUND_HINT_EVERY transactions (as every 30 s).
BOUND_ROWS, BOUND_VOLUME, BOUND_HINT_EVERY = 1_000_000, 20, 50
SPECS = """
name: bench/
replication: 1
fragment: {length: 67108864, compression_codec: NONE, stores: ["file:///"],
           flush_interval: 1h, refresh_interval: 1h}
children:
  - name: bench/playback
  - name: bench/random-0
  - name: bench/random-1
  - name: bench/random-2
  - name: bench/sequential-0
  - name: bench/sequential-1
  - name: bench/sequential-2
  - name: bench/cold
  - name: bench/bound
    fragment: {length: 8388608}
"""
#: Whether the broker serves its data path (``--broker.data-port``), which the
#: recorder's appends then take (``DATA_PATH=1``; off by default, as a broker's is).
DATA_PATH = os.environ.get("DATA_PATH", "0") == "1"
#: The recorded store's options in the overhead and log-size phases (the plain
#: baseline uses the same page size): 1 KiB pages, for these ~100-byte rows.
STORE_OPTIONS: dict[str, Any] = {"page_size": 1024,
                                 **json.loads(os.environ.get("STORE_OPTIONS", "{}"))}
PRAGMAS = (f"page_size={STORE_OPTIONS['page_size']}", "locking_mode=EXCLUSIVE",
           "journal_mode=WAL", "synchronous=OFF", "cache_size=2000",
           "wal_autocheckpoint=1000")  # SQLite's default checkpoints
CREATE_KV = "CREATE TABLE IF NOT EXISTS kv (k INTEGER PRIMARY KEY, v BLOB NOT NULL)"
UPSERT = "INSERT OR REPLACE INTO kv VALUES (?, ?)"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def checkpoint(t: int) -> Checkpoint:
    return Checkpoint.of({"bench/input": t * 100_000}, [], [])


async def take(client: JournalClient, journal: str, root: Path, author: int,
               hints: Hints | None = None) -> tuple[RecordedFolder, Player]:
    """Play `journal` into `root` and become its writer (what a primary's store gets)."""
    player = Player(client, journal, root, hints)
    return RecordedFolder(root, await player.handoff(author)), player


def digest(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha1").hexdigest()


async def bench_playback(client: JournalClient, workdir: Path) -> tuple[float, int]:
    folder, _ = await take(client, "bench/playback", workdir / "recorded", 0x10)
    rng, pool = random.Random(1), memoryview(os.urandom(2 * MiB))
    file, offset = folder.open("data.bin"), 0
    started = time.perf_counter()
    while offset < PLAYBACK_VOLUME:
        size = min(rng.randrange(64 << 10, MiB + 1), PLAYBACK_VOLUME - offset)
        at = rng.randrange(MiB)
        file.pwrite(pool[at:at + size], offset)
        offset += size
        if folder.recorder.pending_bytes >= PLAYBACK_COMMIT:
            await folder.commit()
    await folder.commit()
    file.close()
    head = await client.write_head("bench/playback")
    log(f"playback: recorded {head / MiB:.0f} MiB in {time.perf_counter() - started:.1f} s")
    want, rates, played = digest(workdir / "recorded" / "data.bin"), [], 0
    for run in range(PLAYBACK_RUNS):
        root = workdir / "played"
        await asyncio.to_thread(shutil.rmtree, root, True)  # not the player's time
        player = Player(client, "bench/playback", root)
        started = time.perf_counter()
        await player.play()
        await player.finish()
        elapsed = time.perf_counter() - started
        played = player.progress.played
        rates.append(played / elapsed / 1e6)
        log(f"playback run {run}: {played / MiB:.0f} MiB in {elapsed:.2f} s, "
            f"{rates[-1]:.0f} MB/s")
        if run == 0:
            assert digest(root / "data.bin") == want, "the played file differs"
    return statistics.median(rates), played


def rows_of(rng: random.Random, t: int, pool: list[bytes], workload: str
            ) -> list[tuple[int, bytes]]:
    """Transaction `t`'s rows: "random", keys below 1,000 x (t + 1) (about half new);
    "sequential", the next 1,000 keys."""
    if workload == "sequential":
        return [(t * TXN_ROWS + i, pool[rng.randrange(len(pool))]) for i in range(TXN_ROWS)]
    hi = (t + 1) * TXN_ROWS
    return [(rng.randrange(hi), pool[rng.randrange(len(pool))]) for _ in range(TXN_ROWS)]


def value_pool() -> list[bytes]:
    rng = random.Random(2)
    return [rng.randbytes(50).hex().encode() for _ in range(4096)]  # ~100-byte values


def sqlite_plain(path: Path, workload: str, txns: int, seconds: float = 0.0
                 ) -> tuple[int, float]:
    """(transactions, seconds): `txns` of them, or as many as fit in `seconds`."""
    db = apsw.Connection(str(path))
    for pragma in PRAGMAS:
        db.execute(f"PRAGMA {pragma}")
    db.execute("CREATE TABLE gazette_checkpoint (id INTEGER PRIMARY KEY CHECK (id = 0), "
               "checkpoint BLOB NOT NULL)")
    db.execute(CREATE_KV)
    rng, pool, t, started = random.Random(3), value_pool(), 0, time.perf_counter()
    while t < txns if txns else time.perf_counter() - started < seconds:
        db.execute("BEGIN")
        db.executemany(UPSERT, rows_of(rng, t, pool, workload))
        db.execute("INSERT OR REPLACE INTO gazette_checkpoint VALUES (0, ?)",
                   (checkpoint(t + 1).encode(),))
        db.execute("COMMIT")
        t += 1
    elapsed = time.perf_counter() - started
    db.close()  # not timed: it checkpoints the WAL (the recorded store's close is not)
    return t, elapsed


async def sqlite_recorded(client: JournalClient, journal: str, root: Path, workload: str,
                          txns: int) -> tuple[float, int, int]:
    """(seconds, log bytes, rewrites) of `txns` transactions through SQLiteStore, as a
    shard's runner drives it: up to `commits_in_flight` commits' log appends go on while
    the next transactions run (more while a rewrite records the database)."""
    store = SQLiteStore((await take(client, journal, root, 0x20))[0], **STORE_OPTIONS)
    await store.restore_checkpoint()
    store.db.execute(CREATE_KV)
    await store.start_commit(checkpoint(0), [])
    before = await client.write_head(journal)
    rng, pool, started = random.Random(3), value_pool(), time.perf_counter()
    inflight: collections.deque[asyncio.Future[None]] = collections.deque()
    for t in range(txns):
        store.db.executemany(UPSERT, rows_of(rng, t, pool, workload))
        while len(inflight) >= store.commits_in_flight:
            await inflight.popleft()
        inflight.append(store.start_commit(checkpoint(t + 1), []))
        await asyncio.sleep(0)  # the runner yields here (reading the next messages)
    for commit in inflight:
        await commit
    elapsed = time.perf_counter() - started
    rewrites = store.rewrites - 1  # (its creation's not counted)
    await store.close()
    return elapsed, await client.write_head(journal) - before, rewrites


async def settle(client: JournalClient, journal: str, store: Path) -> None:
    """Wait until the broker persisted `journal`'s closed fragments (its copies and
    fsyncs would overlap the next measurement), then delete those files."""
    deadline = time.monotonic() + 120
    while True:
        frags = await client.list_fragments(journal)
        if all(f.fragment.backing_store for f in frags[:-1]):
            break
        assert time.monotonic() < deadline, f"{journal}: fragments not persisted in time"
        await asyncio.sleep(0.2)
    for f in frags:
        if f.fragment.backing_store:
            (store / f.fragment.path).unlink(missing_ok=True)


async def bench_overhead(client: JournalClient, workdir: Path, workload: str
                         ) -> dict[str, Any]:
    plain, recorded, txns, logged = [], [], 0, 0
    for r in range(ROUNDS):
        for kind in ("plain", "recorded") if r % 2 == 0 else ("recorded", "plain"):
            folder = workdir / f"{kind}-{r}"
            if kind == "plain":  # the first one sets the number of transactions
                folder.mkdir()
                txns, elapsed = sqlite_plain(folder / "plain.db", workload, txns,
                                             0.0 if txns else PLAIN_SECONDS)
                plain.append(elapsed)
                log(f"{workload} round {r}: plain SQLite {txns} transactions in "
                    f"{elapsed:.2f} s")
            else:
                journal = f"bench/{workload}-{r}"
                elapsed, logged, rewrites = await sqlite_recorded(client, journal, folder,
                                                                  workload, txns)
                recorded.append(elapsed)
                log(f"{workload} round {r}: recorded SQLite {txns} transactions in "
                    f"{elapsed:.2f} s ({logged / MiB:.0f} MiB of log, {rewrites} rewrites)")
                await settle(client, journal, workdir / "store")
            await asyncio.to_thread(shutil.rmtree, folder)
    with_s, without_s = statistics.median(recorded), statistics.median(plain)
    name = "" if workload == "random" else f"_{workload}"
    return {f"recording_overhead{name}": round(with_s / without_s - 1, 3),
            f"sqlite_txn_per_s_recorded{name}": round(txns / with_s, 1),
            f"sqlite_txn_per_s_plain{name}": round(txns / without_s, 1),
            f"recorded_mib_per_txn{name}": round(logged / txns / MiB, 2)}


async def bench_log_bound(client: JournalClient, workdir: Path) -> dict[str, Any]:
    """The log a prune leaves under sustained random updates: `BOUND_ROWS` rows, then
    transactions of 1,000 random updates until `BOUND_VOLUME` times the database went
    to the WAL. Hints are kept as a primary keeps them in etcd (`keep_hints`): the
    primary's every `BOUND_HINT_EVERY` transactions (as every 30 s), and all of them at
    once when a rewrite moved them on. At each of those points a prune runs (as
    `gazctl shards prune --every`): it keeps every fragment ending after the first
    offset any of the hints reads from. `log_after_prune_vs_db`: the most it kept, over
    the database's size then (and `_last`: at the end)."""
    folder, _ = await take(client, "bench/bound", workdir / "bound", 0x40)
    store = SQLiteStore(folder, **STORE_OPTIONS)
    await store.restore_checkpoint()
    store.db.execute(CREATE_KV)
    rng, pool = random.Random(5), value_pool()
    for t in range(BOUND_ROWS // TXN_ROWS):
        store.db.executemany(UPSERT, [(t * TXN_ROWS + i, pool[rng.randrange(len(pool))])
                                      for i in range(TXN_ROWS)])
        await store.start_commit(checkpoint(t + 1), [])
    db_bytes = store._db_bytes()
    stored: list[Hints] = []  # primary, backup 1, backup 2
    kept: list[float] = []  # what each prune kept, over the database's size

    async def prune() -> None:
        cutoff = min(h.first_offset() for h in stored)
        frags = await client.list_fragments("bench/bound")
        left = sum(f.fragment.end - f.fragment.begin for f in frags
                   if f.fragment.end > cutoff)
        kept.append(left / store._db_bytes())

    t, started, first = 0, time.perf_counter(), store.wal_recorded
    inflight: collections.deque[asyncio.Future[None]] = collections.deque()
    while store.wal_recorded - first < BOUND_VOLUME * db_bytes:
        store.db.executemany(UPSERT, [(rng.randrange(BOUND_ROWS), pool[rng.randrange(
            len(pool))]) for _ in range(TXN_ROWS)])
        while len(inflight) >= store.commits_in_flight:
            await inflight.popleft()
        inflight.append(store.start_commit(checkpoint(t), []))
        t += 1
        hints = folder.hints
        if hints is None:
            continue
        if folder.moved.is_set() or not stored:  # keep_hints: at once, everywhere
            folder.moved.clear()
            stored = [hints] * 3
            await prune()
        elif t % BOUND_HINT_EVERY == 0:
            stored[0] = hints
            await prune()
    for commit in inflight:
        await commit
    elapsed = time.perf_counter() - started
    written = store.wal_recorded - first
    db_bytes = store._db_bytes()
    head = await client.write_head("bench/bound")
    rewrites = store.rewrites
    await folder.commit()
    hints = folder.hints
    assert hints is not None
    want = store.db.execute("SELECT count(*), sum(length(v)) FROM kv").fetchone()
    await store.close()
    # A cold start from what prune keeps: the database as last rewritten, and the WAL
    # since, mostly patches (played against the pages they patch).
    played_at = time.perf_counter()
    successor_folder, player = await take(client, "bench/bound", workdir / "bound-next",
                                          0x41, hints)
    successor = SQLiteStore(successor_folder, **STORE_OPTIONS)
    await successor.restore_checkpoint()
    played_s = time.perf_counter() - played_at
    got = successor.db.execute("SELECT count(*), sum(length(v)) FROM kv").fetchone()
    assert got == want, (got, want)
    assert successor.db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    await successor.close()
    log(f"log bound: a successor played {player.progress.played / MiB:.0f} MiB of it in "
        f"{played_s:.2f} s")
    log(f"log bound: {t} transactions in {elapsed:.1f} s recorded {written / MiB:.0f} MiB "
        f"of WAL over a {db_bytes / MiB:.0f} MiB database ({rewrites} rewrites); the log "
        f"is {head / MiB:.0f} MiB; {len(kept)} prunes kept at most {max(kept):.2f}x the "
        f"database, {kept[-1]:.2f}x at the end")
    return {"log_after_prune_vs_db": round(max(kept), 2),
            "log_after_prune_vs_db_last": round(kept[-1], 2),
            "log_bound_db_mib": round(db_bytes / MiB, 1),
            "log_bound_wal_vs_db": round(written / db_bytes, 1),
            "log_bound_rewrites": rewrites,
            "log_bound_cold_start_s": round(played_s, 2),
            "log_bound_played_mib": round(player.progress.played / MiB, 1)}


async def bench_cold_start(client: JournalClient, workdir: Path) -> dict[str, Any]:
    store = SQLiteStore((await take(client, "bench/cold", workdir / "primary", 0x30))[0],
                        page_size=4096)  # (1 KiB rows)
    await store.restore_checkpoint()
    store.db.execute(CREATE_KV)
    rng, txns, started = random.Random(4), STORE_ROWS // TXN_ROWS, time.perf_counter()
    for t in range(txns):
        store.db.executemany(UPSERT, [(t * TXN_ROWS + i, rng.randbytes(STORE_ROW_BYTES))
                                      for i in range(TXN_ROWS)])
        await store.start_commit(checkpoint(t + 1), [])
    hints = await store.folder.recorder.commit(hints=True)
    assert hints is not None
    log(f"cold start: built the store in {time.perf_counter() - started:.1f} s, "
        f"{(await client.write_head('bench/cold')) / MiB:.0f} MiB of log")
    await store.close()

    started = time.perf_counter()
    folder, player = await take(client, "bench/cold", workdir / "successor", 0x31, hints)
    successor = SQLiteStore(folder)
    restored = await successor.restore_checkpoint()
    elapsed = time.perf_counter() - started
    assert restored == checkpoint(txns), restored
    count = successor.db.execute("SELECT count(*) FROM kv").fetchone()[0]
    assert count == txns * TXN_ROWS, count
    size = sum(p.stat().st_size for p in (workdir / "successor").glob("store.db*"))
    await successor.close()
    log(f"cold start: {size / MiB:.0f} MiB database (with its WAL), "
        f"{player.progress.played / MiB:.0f} MiB of log played, in {elapsed:.2f} s")
    return {"cold_start_s": round(elapsed, 2), "cold_start_store_mib": round(size / MiB, 1),
            "cold_start_log_mib": round(player.progress.played / MiB, 1)}


async def run(etcd: EmbeddedEtcd, workdir: Path) -> dict[str, Any]:
    result: dict[str, Any] = {}
    journals = [f"bench/{r}" for r in ("playback", "random-0", "sequential-2", "cold")]
    extra = ("--broker.data-port", "0") if DATA_PATH else ()
    result["data_path"] = DATA_PATH
    async with serving_broker(etcd.endpoint, workdir, SPECS, journals, extra) as client:
        if wanted("playback"):
            rate, played = await bench_playback(client, workdir)
            result.update(playback_mb_per_s=round(rate), playback_bytes=played)
            await asyncio.to_thread(shutil.rmtree, workdir / "played")
            await settle(client, "bench/playback", workdir / "store")
        if wanted("overhead"):
            result["sqlite_rows_per_txn"] = TXN_ROWS
            for workload in os.environ.get("WORKLOADS", "random,sequential").split(","):
                result.update(await bench_overhead(client, workdir, workload))
        if wanted("bound"):
            result.update(await bench_log_bound(client, workdir))
        if wanted("cold_start"):
            result.update(await bench_cold_start(client, workdir))
        if wanted("handoff"):
            result.update(await bench_handoff(client, etcd, workdir, client.address))
    return result


def member(name: str, workdir: Path, etcd: EmbeddedEtcd, broker: str) -> Process:
    argv = [sys.executable, "-m", "gazette_consumer", "serve", "--app",
            "gazette_consumer.examples.stream_sum:StreamSum", "--consumer.id", name,
            "--consumer.host", "127.0.0.1", "--consumer.bind", "127.0.0.1",
            "--consumer.port", str(free_port()), "--consumer.http-port", "-1",
            "--broker.address", broker, "--etcd.address", etcd.endpoint]
    return Process(name, argv, workdir / f"{name}.log", env=dict(os.environ))


async def until(check: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.05)


async def more_sums(driver: stream_sum.Driver, n: int, timeout: float = 60) -> None:
    """Wait until `n` more sums were read."""
    goal, deadline = len(driver.sum_uuids) + n, time.monotonic() + timeout
    while len(driver.sum_uuids) < goal:
        assert time.monotonic() < deadline, f"timed out waiting for {n} more sums"
        await driver.check()
        await asyncio.sleep(0.01)


async def bench_handoff(client: JournalClient, etcd: EmbeddedEtcd, workdir: Path,
                        broker: str) -> dict[str, Any]:
    layout = Layout.consumer_app(stream_sum.APP)
    members = [member(f"m{i}", workdir, etcd, broker) for i in range(2)]
    async with Etcd(etcd.endpoint) as etcd_client, \
            KeySpace(etcd_client, layout.root + "/", Decoder(layout, consumers=True)) as ks:
        await stream_sum.setup(client, etcd_client, partitions=1, recovery_logs=True,
                               hot_standbys=1)
        shard = stream_sum.shard_id(0)

        def states() -> dict[str, ReplicaState]:
            return {e.kv.key.rsplit("#", 1)[1]: e.value.state
                    for e in ks.prefixed(layout.item_statuses(shard))}

        def ready() -> bool:
            return sorted(states().values()) == [ReplicaState.STANDBY, ReplicaState.PRIMARY]

        handoffs: list[float] = []
        pauses: list[float] = []
        try:
            for m in members:
                m.start()
            await until(ready, "a primary and a ready standby")
            async with stream_sum.Driver(client, seed=1) as driver:
                stop = asyncio.Event()

                async def probe() -> None:
                    while not stop.is_set():
                        await driver.publish(1, 0)
                        await asyncio.sleep(0.01)  # pacing

                probing = asyncio.create_task(probe())
                try:
                    for _ in range(HANDOFF_ROUNDS):
                        await more_sums(driver, 20)
                        primary = next(m for m in members
                                       if states().get(m.name) == ReplicaState.PRIMARY)
                        old = producer_of(max(driver.sum_uuids.values(), key=clock_of))
                        sent = time.time()
                        os.kill(primary.pid, signal.SIGTERM)
                        first: float | None = None
                        deadline = time.monotonic() + 60
                        while first is None:
                            assert time.monotonic() < deadline, "no sum by the successor"
                            await driver.check()
                            first = min((unix_time_of(u) for u in driver.sum_uuids.values()
                                         if producer_of(u) != old and unix_time_of(u) > sent),
                                        default=None)
                        handoffs.append(first - sent)
                        await asyncio.to_thread(primary.stop, 60.0)
                        pauses.append(max(w for stream, w in driver.waits.items()
                                          if driver.finished_at[stream] >= sent - 1))
                        log(f"hand-off: first sum by the successor {first - sent:.3f} s "
                            f"after SIGTERM; longest wait {pauses[-1]:.3f} s")
                        primary.start()
                        await until(ready, "the restarted member is a ready standby")
                finally:
                    stop.set()
                    await probing
        finally:
            for m in members:
                await asyncio.to_thread(m.stop, 30.0)
    return {"handoff_s": round(statistics.median(handoffs), 3),
            "handoff_pause_s": round(max(pauses), 3)}


def wanted(part: str) -> bool:
    """Whether to run `part` (``--only playback,overhead,cold_start,handoff``: some)."""
    if "--only" not in sys.argv:
        return True
    return part in sys.argv[sys.argv.index("--only") + 1].split(",")


def main() -> None:
    with_tunables()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gz-recoverylog-bench-") as tmp:
        workdir = Path(tmp)
        with EmbeddedEtcd(workdir / "etcd") as etcd:
            result = uvloop.run(run(etcd, workdir))
    log(f"total {time.perf_counter() - started:.0f} s")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
