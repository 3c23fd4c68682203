"""The systems `peers.py` compares, each behind one small interface (`Target`): its
server process (started, awaited until it answers, stopped), its client with the best
pipelining it offers, and the tail writer a separate process runs.

- ``ours``: one ``python -m gazette_broker serve`` process on the caller's etcd,
  journals of replication 1, codec NONE, 64 MiB fragments in a ``file://`` store;
  `gazette.client.JournalClient` with its defaults, bulk appends through `AppendQueue`;
- ``nats``: ``nats-server -js`` (file storage), one stream of one subject per name,
  nats-py, publishes through ``js.publish_async``, reads through an ordered consumer;
- ``redis``: ``redis-server`` (AOF on, fsynced every second, no RDB snapshots), one
  stream key per name, ``redis.asyncio`` (hiredis), XADDs in pipelines, XRANGE/XREAD.

Every payload here is `PAYLOAD` bytes except the 1 KiB appends of the latency workload,
so heads of NATS and Redis streams are counted as messages x `PAYLOAD`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import nats
import redis.asyncio as aioredis
from nats.aio.msg import Msg
from nats.js.api import StorageType, StreamConfig
from nats.js.errors import NotFoundError

from gazette.client import AppendQueue, AppendResult, JournalClient
from gazette.keyspace import Etcd, Layout, apply_changes
from gazette.protocol import journal_changes_from_yaml

MiB = 1 << 20
PAYLOAD = 64 << 10
#: `AppendQueue.wait_for_room` every this many appends, as `bench_append_queue` does.
OURS_ROOM_EVERY = 256
#: Unacknowledged `js.publish_async` publishes.
NATS_WINDOW = 256
#: Redis: pipelines in flight, and XADDs in each.
REDIS_PIPELINES, REDIS_PIPELINE_DEPTH = 2, 64
#: Entries per XRANGE and XREAD reply (4 MiB): 64 beat 16, 256 and 1,024 for XRANGE in
#: trials here; the tail reader with 256 caught up no better, with 1,024 it starved the
#: writer (Redis serves one client's request at a time: a 64 MiB reply holds up XADDs).
REDIS_READ_COUNT = 64
START_TIMEOUT = 30.0

SYSTEMS = ("ours", "nats", "redis")
TITLES = {"ours": "ours", "nats": "NATS JetStream", "redis": "Redis"}
BINARIES = {"nats": "nats-server", "redis": "redis-server"}

#: A journal of replication 1, codec NONE, 64 MiB fragments in the file:// store.
JOURNAL_YAML = """
name: peers/
replication: 1
fragment:
  length: 67108864
  compression_codec: NONE
  stores: ["file:///"]
  flush_interval: 1h
  refresh_interval: 1h
children:
  - name: peers/{name}
"""


@dataclass(frozen=True, slots=True)
class Tail:
    """What a tail reader saw: payload bytes read until it stopped, whether it stopped
    because it caught up with the head (else: the cap or the deadline), the head then
    (bytes) and when (perf_counter)."""

    read_bytes: int
    caught_up: bool
    head: int
    at: float


class Target:
    """One system under test, as its client sees it. Names (``append-0``...) map to a
    journal, a JetStream stream and subject, or a Redis key."""

    system: str
    window: str  #: the bulk append pipelining, for the output
    read_method: str  #: how reads and the tail reader work, for the output
    durability: str  #: what an acknowledgement means, for the output

    def __init__(self, address: str) -> None:
        self.address = address

    async def create(self, name: str) -> None:
        """Make `name` ready for appends (empty)."""

    async def append_stream(self, name: str, payload: bytes, count: int,
                            seconds: float) -> int:
        """Append `payload` up to `count` times with the client's best pipelining,
        sending no more once `seconds` have passed; return how many were acknowledged
        (all that were sent: it raises otherwise)."""
        raise NotImplementedError

    async def append_one(self, name: str, data: bytes) -> None:
        """One append, one request, awaited until acknowledged."""
        raise NotImplementedError

    async def read_range(self, name: str, count: int) -> int:
        """Read the first `count` payloads of `name` from the start; their bytes."""
        raise NotImplementedError

    async def head(self, name: str) -> int:
        """Bytes appended to `name` so far."""
        raise NotImplementedError

    async def tail_read(self, name: str, cap: int, seconds: float) -> Tail:
        """Read `name` from the start, following the head, until caught up with it, the
        head passes `cap` bytes, or `seconds` pass."""
        raise NotImplementedError

    async def settle(self, name: str) -> None:
        """Wait (bounded) for background work the appends to `name` started, so that it
        does not land in the next measurement."""

    async def drop(self, name: str) -> None:
        """Free what `name` holds."""

    async def close(self) -> None:
        """Close the client."""
        raise NotImplementedError


class Ours(Target):
    system = "ours"
    window = ("`AppendQueue` with its defaults: up to 64 MiB (1,024 x 64 KiB) queued or in "
              "flight, sent as one Append RPC of up to 4 MiB at a time per journal; "
              f"`wait_for_room()` every {OURS_ROOM_EVERY} appends")
    read_method = ("`client.read(journal, 0, end_offset=...)` through the broker; tail: "
                   "`client.read(journal, 0, block=True)`")
    durability = ("acknowledged once in the primary's spool file (written, not fsynced), "
                  "replication 1; persisted to the `file://` store later, when its 64 MiB "
                  "fragment closes")

    def __init__(self, address: str, etcd_endpoint: str | None = None) -> None:
        super().__init__(address)
        self.etcd_endpoint = etcd_endpoint
        self.client = JournalClient(address)

    @staticmethod
    def journal(name: str) -> str:
        return f"peers/{name}"

    async def create(self, name: str) -> None:
        assert self.etcd_endpoint is not None, "only the benchmark process creates journals"
        async with Etcd(self.etcd_endpoint) as etcd:
            await apply_changes(etcd, Layout.brokers(),
                                journal_changes_from_yaml(JOURNAL_YAML.format(name=name)))
        deadline = time.monotonic() + START_TIMEOUT
        while True:  # until the broker serves it
            try:
                await self.client.write_head(self.journal(name))
                return
            except Exception as exc:  # not assigned yet
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the broker did not serve {self.journal(name)} "
                                       f"within {START_TIMEOUT:.0f} s: {exc!r}") from exc
                await asyncio.sleep(0.05)

    async def append_stream(self, name: str, payload: bytes, count: int,
                            seconds: float) -> int:
        journal, queue = self.journal(name), AppendQueue(self.client)
        pending: deque[asyncio.Future[AppendResult]] = deque()
        sent, stop_at = 0, time.perf_counter() + seconds
        try:
            while sent < count and time.perf_counter() < stop_at:
                pending.append(queue.append(journal, payload))
                sent += 1
                if sent % OURS_ROOM_EVERY == 0:
                    await queue.wait_for_room()
                    while pending and pending[0].done():
                        pending.popleft().result()  # raises if it failed
            await asyncio.gather(*pending)
        except BaseException:
            await queue.close(flush=False)
            raise
        await queue.close()
        return sent

    async def append_one(self, name: str, data: bytes) -> None:
        await self.client.append(self.journal(name), data)

    async def read_range(self, name: str, count: int) -> int:
        got = 0
        async for chunk in self.client.read(self.journal(name), 0,
                                            end_offset=count * PAYLOAD):
            got += len(chunk.content)
        return got

    async def head(self, name: str) -> int:
        return await self.client.write_head(self.journal(name))

    async def tail_read(self, name: str, cap: int, seconds: float) -> Tail:
        got = head = 0
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds), contextlib.aclosing(
                    self.client.read(self.journal(name), 0, block=True)) as chunks:
                async for chunk in chunks:
                    got += len(chunk.content)
                    head = chunk.write_head
                    if chunk.end >= head or head >= cap:
                        return Tail(got, chunk.end >= head, head, time.perf_counter())
        return Tail(got, False, await self.head(name), time.perf_counter())

    async def settle(self, name: str) -> None:
        """Until every closed fragment of the journal is in the store (60 s at most)."""
        deadline = time.monotonic() + 60
        while True:
            frags = await self.client.list_fragments(self.journal(name))
            if all(f.fragment.backing_store for f in frags[:-1]):
                return
            if time.monotonic() > deadline:
                print(f"ours: {self.journal(name)} still has unpersisted fragments after 60 s",
                      file=sys.stderr, flush=True)
                return
            await asyncio.sleep(0.1)

    async def close(self) -> None:
        await self.client.close()


class Nats(Target):
    system = "nats"
    window = (f"`js.publish_async` with `publish_async_max_pending={NATS_WINDOW}`: "
              f"{NATS_WINDOW} unacknowledged publishes")
    read_method = ("an ordered consumer (push, flow control) with a callback, from the "
                   "start; it beat a pull consumer fetching batches of 64, 256 or 1,000 "
                   "(ack policy none) by ~1.3x in trials here; tail: the same, caught up "
                   "when a message's `num_pending` is 0")
    durability = ("acknowledged once in its file store (v2.9, one replica: written to the "
                  "stream's block file before the ack), fsynced every 2 min by default "
                  "(`sync_interval`)")

    def __init__(self, address: str, nc: Any) -> None:
        super().__init__(address)
        self.nc = nc
        self.js = nc.jetstream(publish_async_max_pending=NATS_WINDOW)

    @classmethod
    async def connect(cls, address: str) -> Nats:
        return cls(address, await nats.connect(address, allow_reconnect=False))

    @staticmethod
    def stream(name: str) -> str:
        return f"peers-{name}"

    @staticmethod
    def subject(name: str) -> str:
        return f"peers.{name}"

    async def create(self, name: str) -> None:
        await self.drop(name)
        await self.js.add_stream(StreamConfig(name=self.stream(name),
                                              subjects=[self.subject(name)],
                                              storage=StorageType.FILE))

    async def append_stream(self, name: str, payload: bytes, count: int,
                            seconds: float) -> int:
        subject = self.subject(name)
        window: deque[asyncio.Future[Any]] = deque()
        sent, stop_at = 0, time.perf_counter() + seconds
        while sent < count and time.perf_counter() < stop_at:
            # Waits while NATS_WINDOW publishes are unacknowledged.
            window.append(await self.js.publish_async(subject, payload))
            sent += 1
            while window and window[0].done():
                window.popleft().result()  # raises if the stream refused it
        await asyncio.gather(*window)
        return sent

    async def append_one(self, name: str, data: bytes) -> None:
        await self.js.publish(self.subject(name), data)

    async def read_range(self, name: str, count: int) -> int:
        got, seen, done = 0, 0, asyncio.Event()

        async def on_msg(msg: Msg) -> None:
            nonlocal got, seen
            if seen < count:
                got += len(msg.data)
                seen += 1
                if seen == count:
                    done.set()

        sub = await self.js.subscribe(self.subject(name), stream=self.stream(name),
                                      ordered_consumer=True, cb=on_msg)
        try:
            await done.wait()
        finally:
            await sub.unsubscribe()
        return got

    async def head(self, name: str) -> int:
        info = await self.js.stream_info(self.stream(name))
        return int(info.state.messages) * PAYLOAD

    async def tail_read(self, name: str, cap: int, seconds: float) -> Tail:
        got, done = 0, asyncio.Event()
        seen: list[Tail] = []

        async def on_msg(msg: Msg) -> None:
            nonlocal got
            if done.is_set():
                return
            got += len(msg.data)
            meta = msg.metadata
            head = (meta.sequence.stream + meta.num_pending) * PAYLOAD
            if meta.num_pending == 0 or head >= cap:
                seen.append(Tail(got, meta.num_pending == 0, head, time.perf_counter()))
                done.set()

        sub = await self.js.subscribe(self.subject(name), stream=self.stream(name),
                                      ordered_consumer=True, cb=on_msg)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await done.wait()
        finally:
            await sub.unsubscribe()
        if seen:
            return seen[0]
        done.set()
        return Tail(got, False, await self.head(name), time.perf_counter())

    async def drop(self, name: str) -> None:
        with contextlib.suppress(NotFoundError):
            await self.js.delete_stream(self.stream(name))

    async def close(self) -> None:
        await self.nc.close()


class Redis(Target):
    system = "redis"
    window = (f"{REDIS_PIPELINES} pipelines of {REDIS_PIPELINE_DEPTH} XADDs in flight "
              "(`transaction=False`), each on a connection of its own")
    read_method = (f"XRANGE COUNT {REDIS_READ_COUNT} from `-`, then from `(` the last id; "
                   f"tail: XREAD COUNT {REDIS_READ_COUNT} BLOCK 1000, caught up when a "
                   f"reply holds fewer than {REDIS_READ_COUNT}")
    durability = ("acknowledged once in memory and appended to the AOF (written before the "
                  "reply), fsynced every second (`appendfsync everysec`), no replica; the "
                  "AOF is rewritten (a forked child writes the whole data set) whenever it "
                  "doubled since the last rewrite (`auto-aof-rewrite-percentage 100`): every "
                  "round starts from a rewritten, small AOF, as on a fresh server")

    def __init__(self, address: str) -> None:
        super().__init__(address)
        host, port = address.rsplit(":", 1)
        self.r = aioredis.Redis(host=host, port=int(port))

    @staticmethod
    def key(name: str) -> str:
        return f"peers:{name}"

    @staticmethod
    def fields(payload: bytes) -> dict[Any, Any]:
        """A stream entry of one field: ``d`` -> the payload."""
        return {b"d": payload}

    async def create(self, name: str) -> None:
        await self.r.delete(self.key(name))

    async def append_stream(self, name: str, payload: bytes, count: int,
                            seconds: float) -> int:
        key, fields = self.key(name), self.fields(payload)
        sent, stop_at = 0, time.perf_counter() + seconds

        async def pipelines() -> None:
            nonlocal sent
            while sent < count and time.perf_counter() < stop_at:
                n = min(REDIS_PIPELINE_DEPTH, count - sent)
                sent += n
                pipe = self.r.pipeline(transaction=False)
                for _ in range(n):
                    pipe.xadd(key, fields)
                await pipe.execute()  # raises if any failed

        await asyncio.gather(*(pipelines() for _ in range(REDIS_PIPELINES)))
        return sent

    async def append_one(self, name: str, data: bytes) -> None:
        await self.r.xadd(self.key(name), self.fields(data))

    async def read_range(self, name: str, count: int) -> int:
        key, start, got, seen = self.key(name), b"-", 0, 0
        while seen < count:
            entries: Any = await self.r.xrange(key, start, b"+",
                                               count=min(REDIS_READ_COUNT, count - seen))
            if not entries:
                break
            for _, fields in entries:
                got += len(fields[b"d"])
            seen += len(entries)
            start = b"(" + entries[-1][0]
        return got

    async def head(self, name: str) -> int:
        return int(await self.r.xlen(self.key(name))) * PAYLOAD

    async def tail_read(self, name: str, cap: int, seconds: float) -> Tail:
        key, last, got, seen = self.key(name), b"0-0", 0, 0
        now = time.perf_counter()
        stop_at, check_at = now + seconds, now + 0.25
        while True:
            reply: Any = await self.r.xread({key: last}, count=REDIS_READ_COUNT, block=1000)
            entries = reply[0][1] if reply else []
            for _, fields in entries:
                got += len(fields[b"d"])
            seen += len(entries)
            if entries:
                last = entries[-1][0]
            now = time.perf_counter()
            if seen and len(entries) < REDIS_READ_COUNT:
                return Tail(got, True, seen * PAYLOAD, now)
            if now >= check_at:  # how far the writer got: stop at the cap
                check_at = now + 0.25
                if (head := await self.head(name)) >= cap:
                    return Tail(got, False, head, time.perf_counter())
            if now >= stop_at:
                return Tail(got, False, await self.head(name), time.perf_counter())

    async def settle(self, name: str) -> None:
        """Until no AOF rewrite runs or waits to (120 s at most): Redis forks one
        whenever the AOF doubled since the last (`auto-aof-rewrite-percentage 100`)."""
        deadline = time.monotonic() + 120
        while True:
            info = await self.r.info("persistence")
            if not (info.get("aof_rewrite_in_progress") or info.get("aof_rewrite_scheduled")):
                return
            if time.monotonic() > deadline:
                print("redis: an AOF rewrite still runs after 120 s", file=sys.stderr,
                      flush=True)
                return
            await asyncio.sleep(0.05)

    async def drop(self, name: str) -> None:
        """Delete the key, then rewrite the AOF (and wait for it): the AOF shrinks to
        what is left, as on a fresh server, so that every round's appends pay the
        rewrites a growing AOF causes alike (and the old AOF's disk and page cache go)."""
        await self.r.delete(self.key(name))
        await self.settle(name)
        await self.r.bgrewriteaof()
        await self.settle(name)

    async def close(self) -> None:
        await self.r.aclose()


async def connect(system: str, address: str, etcd_endpoint: str | None = None) -> Target:
    """A client of `system`'s server at `address`."""
    if system == "ours":
        return Ours(address, etcd_endpoint)
    if system == "nats":
        return await Nats.connect(address)
    if system == "redis":
        return Redis(address)
    raise ValueError(f"unknown system {system!r}")


async def tail_writer(system: str, address: str, name: str) -> None:
    """Append `PAYLOAD`s to `name` with the system's bulk pipelining until killed (the
    writer of the tail workload, in a process of its own)."""
    target = await connect(system, address)
    try:
        payload = os.urandom(PAYLOAD)
        while True:
            await target.append_stream(name, payload, 1 << 30, float("inf"))
    finally:
        await target.close()
