"""The FastStream baseline of events_bench.py: typed pydantic messages over NATS JetStream.

What an application would write with FastStream 0.7 instead of our events library: the same
`Order` model, a JetStream stream on file storage, at-least-once delivery. Produces `count`
orders, then consumes them, each phase timed alone:

- produce: `broker.publish(order, subject, stream=...)`, which awaits each JetStream ack.
  FastStream has no pipelined publish (its JetStream producer calls nats-py's `js.publish`,
  one round trip each; `publish_batch` raises for NATS), so `PUBLISHERS` coroutines share
  the work (16 made ~15k/s, 32 ~17k/s, more no better). `broker.publish` beat a publisher
  object's `publish` by ~10% (its middlewares); the publisher object only declares the stream.
- consume: a durable pull subscriber with `PullSub(batch=True)`, its handler taking
  `list[Order]` (FastStream validates every message into the model); it beat per-message
  handlers (`batch=False`: ~7k/s against ~23k/s). `AckPolicy.NACK_ON_ERROR` acks each message
  after the handler returns and naks (redelivers) on an error; the default, `REJECT_ON_ERROR`,
  would `term` it, i.e. drop it. The clock runs from starting the subscriber (connecting,
  creating the consumer) until the handler has seen every order; the acks are checked after.
  A final partial batch waits out the pull's 0.1 s timeout (none with 20,000 and 500).

FastStream logs every message at INFO to stdout by default: the brokers log them at DEBUG to
a logger at WARNING instead, so stdout holds only the JSON line and errors reach stderr.

Run alone: `cd benchmarks && python faststream_baseline.py` prints one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import pathlib
import tempfile
import time

import uvloop
from consumer_bench import nats_server  # type: ignore[import-not-found]
from events_models import Order, order  # type: ignore[import-not-found]
from faststream import AckPolicy
from faststream.nats import JStream, NatsBroker, PullSub, StorageType

STREAM, SUBJECT, DURABLE = "fs-orders", "fs.orders", "fs-orders-consumer"
PUBLISHERS = 32  # concurrent publishing coroutines (one ack round trip in flight each)
BATCH = 500  # messages per pull request and per handler call (under max_ack_pending 1000)
TIMEOUT = 300.0
QUIET = logging.getLogger("faststream_baseline")
QUIET.setLevel(logging.WARNING)


async def _produce(url: str, count: int) -> float:
    """Publishes `count` orders, every JetStream ack awaited; returns the seconds it took."""
    broker = NatsBroker(url, logger=QUIET, log_level=logging.DEBUG)
    broker.publisher(SUBJECT, stream=JStream(STREAM, subjects=[SUBJECT], storage=StorageType.FILE))
    await broker.start()  # declares the stream of its publishers
    try:

        async def share(first: int) -> None:
            for i in range(first, count, PUBLISHERS):
                await broker.publish(order(i), SUBJECT, stream=STREAM)  # raises if refused

        started = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(share(p) for p in range(PUBLISHERS))), TIMEOUT)
        return time.perf_counter() - started
    finally:
        await broker.stop()


async def _consume(url: str, count: int) -> float:
    """Consumes until every order was handled; returns the seconds from subscribing."""
    broker = NatsBroker(url, logger=QUIET, log_level=logging.DEBUG)
    seen: set[int] = set()
    handled = 0
    done = asyncio.Event()

    @broker.subscriber(
        SUBJECT,
        stream=JStream(STREAM, declare=False),
        durable=DURABLE,
        pull_sub=PullSub(batch_size=BATCH, timeout=0.1, batch=True),
        ack_policy=AckPolicy.NACK_ON_ERROR,
    )
    async def handle(orders: list[Order]) -> None:
        nonlocal handled
        handled += len(orders)
        seen.update(o.order_id for o in orders)
        if len(seen) >= count:
            done.set()

    started = time.perf_counter()
    await broker.start()
    try:
        try:
            await asyncio.wait_for(done.wait(), TIMEOUT)
        except TimeoutError:
            raise RuntimeError(
                f"FastStream consumed {len(seen)} of {count} orders in {TIMEOUT:.0f} s"
            ) from None
        elapsed = time.perf_counter() - started
        await _check_acked(broker)
    finally:
        await broker.stop()
    if handled != count or seen != set(range(count)):
        raise RuntimeError(
            f"FastStream consumed {handled} messages, {len(seen)} distinct orders, expected {count}"
        )
    return elapsed


async def _check_acked(broker: NatsBroker) -> None:
    """At least once: the server must hold every message acked (acks are sent async)."""
    js = broker.connection.jetstream()
    deadline = time.monotonic() + 10
    while True:
        info = await js.consumer_info(STREAM, DURABLE)
        if not (info.num_ack_pending or info.num_pending or info.num_redelivered):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"FastStream consumer not fully acked: {info}")
        await asyncio.sleep(0.01)


async def faststream_baseline(workdir: pathlib.Path, count: int) -> dict[str, float]:
    """Produce then consume `count` orders with FastStream on a fresh `nats-server -js`."""
    async with nats_server(workdir) as url:
        produce = await _produce(url, count)
        consume = await _consume(url, count)
    return {
        "produce_msgs_per_s": count / produce,
        "consume_msgs_per_s": count / consume,
        "msgs_per_s": count / (produce + consume),
    }


async def _main() -> None:
    with tempfile.TemporaryDirectory(prefix="gz-faststream-") as tmp:
        result = await faststream_baseline(pathlib.Path(tmp), 20_000)
    print(json.dumps({k: round(v) for k, v in result.items()}))


if __name__ == "__main__":
    uvloop.run(_main())
