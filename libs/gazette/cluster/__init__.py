"""The cluster layer: what brokers and consumer members both do, generic over the item
spec (a journal, a shard).

- membership (`Membership`): the member spec under a lease, liveness, the allocator, the
  drain before stopping;
- resolving (`Resolver`, `Resolution`): an item's spec, route and endpoints at a revision,
  response headers;
- local items (`LocalItems`): this member's assignments as running, supervised local
  objects, opened, updated and closed as the keyspace changes; `Announcer` writes the
  routes their primaries synced, `StatusWriter` the states of this member's replicas;
- operations (`http_app`, `add_ops_routes`, `HttpRunner`): a member's HTTP application,
  ``/metrics`` and ``/healthz`` open and every other route behind its tokens, served with
  bounds on idle and malformed connections;
- malformed requests (`malformed.add_guarded`): a service's undecodable request messages
  refused with INVALID_ARGUMENT naming the field;
- forwarding (`Channels`, `forward_unary`, `forward_stream`, `proxied`): a request for
  an item served elsewhere goes on to a member of its route.
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
from gazette.cluster.ops import (
    IDLE_TIMEOUT,
    LISTEN_BACKLOG,
    HttpCheck,
    HttpRunner,
    add_ops_routes,
    http_app,
)
from gazette.cluster.resolver import Resolution, Resolver
from gazette.cluster.status import StatusWriter, status_consistent

__all__ = [
    "CLOSED_DELETED",
    "CLOSED_MOVED",
    "DEFAULT_ETCD_STARTUP_TIMEOUT",
    "DEFAULT_LEASE_TTL",
    "FORWARDED",
    "IDLE_TIMEOUT",
    "LEASE_MARGIN",
    "LISTEN_BACKLOG",
    "PROXY_ANSWER_SECONDS",
    "Announcer",
    "Channels",
    "HttpCheck",
    "HttpRunner",
    "LocalItem",
    "LocalItems",
    "Membership",
    "NotReady",
    "Resolution",
    "Resolver",
    "StatusWriter",
    "add_ops_routes",
    "forward_stream",
    "forward_unary",
    "http_app",
    "proxied",
    "status_consistent",
    "until_etcd",
]
