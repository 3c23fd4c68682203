"""A process of a service using every part of the events library the dashboards show:
orders produced both directly and through the outbox (a database transaction, swept by
the catch-up producer), an exactly-once handler, an at-least-once handler whose policy
saves failures as dead letters (every fifth order fails), and a broadcast handler. It
serves its metrics on a port of its own; the monitoring fault test scrapes it."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import sys
from typing import Any

import prometheus_client

from gazette.events import Event, Events, OnFailure
from gazette.events.outbox import connect
from tests.fault.events_member import ORDERS
from tests.fixtures.events import Order


async def main(broker: str, etcd: str, dsn: str, consumer_root: str, http_port: str,
               security: str = "{}") -> None:
    events = Events(broker_address=broker, etcd_address=etcd, dsn=dsn,
                    catch_up_interval=1.0, catch_up_min_age=0.5,
                    member={"host": "127.0.0.1", "lease_ttl": 4, "etcd_root": consumer_root,
                            "suffix": "ops", "drain_timeout": 5.0, **json.loads(security)})

    @events.exactly_once("effects", ORDERS)
    async def apply(tx: Any, event: Event[Order]) -> None:
        await tx.execute("INSERT INTO effects (event_id, member) VALUES (%s, 'ops')",
                         (event.id,))

    @events.idempotent("audit", ORDERS, on_failure=OnFailure.SAVE)
    async def audit(event: Event[Order]) -> None:
        if event.payload.id % 5 == 0:
            raise ValueError(f"order {event.payload.id} fails its audit")

    @events.broadcast(ORDERS)
    async def seen(event: Event[Order]) -> None:
        pass

    # A service's own metrics endpoint, as docs/events.md says (each group is a consumer
    # member of its own; none serves HTTP here).
    prometheus_client.start_http_server(int(http_port), addr="127.0.0.1")
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with events, await connect(dsn) as conn:
        print("ready", flush=True)
        for n in itertools.count():
            if n % 2:
                await events.produce(ORDERS, Order(id=n, customer=f"c{n % 3}"))
            else:
                async with events.transaction(conn) as tx:
                    tx.produce(ORDERS, Order(id=n, customer=f"c{n % 3}"))
            try:
                await asyncio.wait_for(stop.wait(), 0.1)
                return
            except TimeoutError:
                continue


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
