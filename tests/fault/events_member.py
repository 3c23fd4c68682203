"""A process of a service with an exactly-once handler (the events fault test runs it
and SIGKILLs it): each event becomes one row of ``effects``, in batches of 20, each
batch taking a while so that a kill lands in the middle of one."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from typing import Any

from gazette.events import Event, Events, Topic
from tests.fixtures.events import Order

ORDERS = Topic("orders", Order, key=lambda o: o.customer, partitions=2)


async def main(broker: str, etcd: str, dsn: str, consumer_root: str, name: str,
               security: str = "{}") -> None:
    """`security`: JSON of the members' security options (`SecurityConfig` fields)."""
    events = Events(broker_address=broker, etcd_address=etcd, dsn=dsn, catch_up=False,
                    member={"host": "127.0.0.1", "lease_ttl": 2, "etcd_root": consumer_root,
                            "suffix": name, "drain_timeout": 5.0, **json.loads(security)})

    @events.exactly_once("effects", ORDERS, batch_size=20)
    async def apply(tx: Any, batch: list[Event[Order]]) -> None:
        await tx.execute("INSERT INTO effects (event_id, member) SELECT unnest(%s::text[]), %s",
                         ([e.id for e in batch], name))
        await asyncio.sleep(0.02)  # the batch is under way: a kill lands here

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with events:
        print("ready", flush=True)
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
