"""The cluster layer: what brokers and consumer members both do, generic over the item
spec (a journal, a shard).

- membership (`Membership`): the member spec under a lease, liveness, the allocator, the
  drain before stopping;
- resolving (`Resolver`, `Resolution`): an item's spec, route and endpoints at a revision,
  response headers;
- local items (`LocalItems`): this member's assignments as running, supervised local
  objects, opened, updated and closed as the keyspace changes; `Announcer` writes the
  routes their primaries synced, `StatusWriter` the states of this member's replicas;
- forwarding (`Channels`, `forward_unary`, `forward_stream`, `proxied`): a request for
  an item served elsewhere goes on to a member of its route.

A member process's shell (its listeners, its start and stop) is `gazette.serving`, above
this layer.
"""

from gazette.cluster.announce import Announcer
from gazette.cluster.forward import (
    FORWARDED,
    PROXY_ANSWER_SECONDS,
    Channels,
    forward_stream,
    forward_unary,
    proxied,
)
from gazette.cluster.local import (
    CLOSED_DELETED,
    CLOSED_MOVED,
    LocalItem,
    LocalItems,
    NotReady,
)
from gazette.cluster.membership import (
    DEFAULT_ETCD_STARTUP_TIMEOUT,
    DEFAULT_LEASE_TTL,
    LEASE_MARGIN,
    Membership,
    until_etcd,
)
from gazette.cluster.resolver import Resolution, Resolver
from gazette.cluster.status import StatusWriter, status_consistent

__all__ = [
    "CLOSED_DELETED",
    "CLOSED_MOVED",
    "DEFAULT_ETCD_STARTUP_TIMEOUT",
    "DEFAULT_LEASE_TTL",
    "FORWARDED",
    "LEASE_MARGIN",
    "PROXY_ANSWER_SECONDS",
    "Announcer",
    "Channels",
    "LocalItem",
    "LocalItems",
    "Membership",
    "NotReady",
    "Resolution",
    "Resolver",
    "StatusWriter",
    "forward_stream",
    "forward_unary",
    "proxied",
    "status_consistent",
    "until_etcd",
]
