"""Orders: an order and its event commit together; each customer's total counts every
order exactly once. Needs BROKER_ADDRESS, ETCD_ADDRESS and ORDERS_DSN (PostgreSQL)."""

import asyncio
import os
from typing import Any

import psycopg
from pydantic import BaseModel

from gazette.events import Event, Events, Topic


class OrderPlaced(BaseModel):
    order_id: int
    customer: str
    cents: int


ORDERS = Topic("orders", OrderPlaced, key=lambda o: o.customer)
events = Events(broker_address=os.environ.get("BROKER_ADDRESS", "localhost:8080"),
                etcd_address=os.environ.get("ETCD_ADDRESS", "http://localhost:2379"),
                dsn=os.environ["ORDERS_DSN"])
Connection = psycopg.AsyncConnection[Any]


async def add_to_total(tx: Connection, event: Event[OrderPlaced]) -> None:
    await tx.execute("INSERT INTO totals VALUES (%s, %s) ON CONFLICT (customer) DO UPDATE "
                     "SET cents = totals.cents + excluded.cents",
                     (event.payload.customer, event.payload.cents))
events.exactly_once("billing", ORDERS, add_to_total)


async def place(conn: Connection, order: OrderPlaced) -> None:
    async with events.transaction(conn) as tx:
        await tx.connection.execute("INSERT INTO orders VALUES (%s, %s, %s)",
                                    (order.order_id, order.customer, order.cents))
        tx.produce(ORDERS, order)


async def main() -> None:
    async with events, await psycopg.AsyncConnection.connect(os.environ["ORDERS_DSN"]) as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS orders (id INT PRIMARY KEY, "
                           "customer TEXT, cents INT)")
        await conn.execute("CREATE TABLE IF NOT EXISTS totals (customer TEXT PRIMARY KEY, "
                           "cents INT)")
        await conn.commit()
        for i in range(10):
            await place(conn, OrderPlaced(order_id=i, customer=f"c{i % 3}", cents=100))
        while (await (await conn.execute("SELECT sum(cents) FROM totals")).fetchone()
               or [None])[0] != 1000:
            await conn.rollback()  # a fresh snapshot next time
            await asyncio.sleep(0.1)
        print(await (await conn.execute("SELECT * FROM totals ORDER BY 1")).fetchall())


if __name__ == "__main__":
    asyncio.run(main())
