"""The message model events_bench.py sends through our events library and through its
FastStream baseline alike (the same pydantic model, so both pay the same validation)."""

from __future__ import annotations

from pydantic import BaseModel


class Order(BaseModel):
    """An order placed: about 100 bytes of JSON."""

    order_id: int
    customer: str
    amount_cents: int
    note: str = ""


def order(i: int) -> Order:
    return Order(order_id=i, customer=f"c{i % 1000}", amount_cents=100 + i % 997,
                 note="pad" * 8)
