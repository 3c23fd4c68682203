"""Events: typed topics over journals, produced and consumed in one line each.

A `Topic` binds a name to a model (pydantic, msgspec or a dataclass) and to journals
(``events/<topic>/part-NNN``, made on first use). `Events` produces (``await
events.produce(topic, payload)``, or inside a PostgreSQL transaction through an outbox:
``async with events.transaction(conn) as tx: tx.produce(topic, payload)``) and consumes:
idempotent and exactly-once handlers in consumer groups (shards of the consumer
framework), and broadcast handlers in every process. Each handler has a failure policy
(`OnFailure`). See docs/events.md.
"""

from gazette.events.broadcast import Subscription
from gazette.events.handlers import Handler, Kind, OnFailure
from gazette.events.library import Events, EventsTx
from gazette.events.topic import Event, EventTypeError, Topic, TopicNotRegistered

__all__ = [
    "Event",
    "EventTypeError",
    "Events",
    "EventsTx",
    "Handler",
    "Kind",
    "OnFailure",
    "Subscription",
    "Topic",
    "TopicNotRegistered",
]
