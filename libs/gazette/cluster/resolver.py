"""Where an item is served: its spec and route as this member's keyspace says, at a
revision, and the response header that tells clients so.

The items assigned to this member are followed incrementally from the keyspace's changes
(one set of keys), so asking costs nothing however many items the cluster has. A request
pinned to an etcd revision this member has not reached waits for it, briefly, but only
for a revision etcd has reached: a client naming one far ahead is refused at once,
instead of stalling requests.

Generic over the item's spec type: journals for brokers, shards for consumers.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from gazette.allocator import EMPTY_ROUTE, Route, assignments_of, route_of
from gazette.errors import ValidationError
from gazette.keyspace import EtcdError, Event, KeySpace, Layout
from gazette.pb import broker_pb2 as pb
from gazette.protocol import MemberSpec, ProcessId, ReplicaStatus

#: How long a request pinned to a newer etcd revision waits for this member to catch up.
REVISION_WAIT_SECONDS = 5.0

SpecT = TypeVar("SpecT")


@dataclass(frozen=True, slots=True)
class Resolution(Generic[SpecT]):
    """An item's `spec` (None: no such item) and `route`, with each route member's
    endpoint, as of etcd `revision`."""

    item: str
    spec: SpecT | None
    route: Route
    endpoints: tuple[str, ...]
    revision: int
    #: Whether every assignment holds `route` as its value (the primary announced it
    #: and no assignment was added or moved since).
    announced: bool = True
    #: Each route member's data endpoint ("": none), index-aligned; () if none has one.
    data_endpoints: tuple[str, ...] = ()

    @property
    def primary_endpoint(self) -> str:
        return self.endpoints[self.route.primary] if self.route.primary >= 0 else ""

    def endpoint_near(self, zone: str) -> str:
        """A route member's endpoint to send a read to: one in `zone` if any (same-zone
        traffic is cheaper and faster), else the first known; "" if none is."""
        for member, endpoint in zip(self.route.members, self.endpoints, strict=True):
            if member.zone == zone and endpoint:
                return endpoint
        return next((e for e in self.endpoints if e), "")


class Resolver(Generic[SpecT]):
    """Resolves items of type `spec_type` against `keyspace` for the member `me`."""

    def __init__(self, keyspace: KeySpace[Any], layout: Layout, me: ProcessId,
                 spec_type: type[SpecT]) -> None:
        self.keyspace, self.layout, self.me = keyspace, layout, me
        self.spec_type = spec_type
        self.me_pb = pb.ProcessSpec.ID(zone=me.zone, suffix=me.suffix)
        self._mine = f"#{me.zone}#{me.suffix}#"
        #: Item -> its assignment keys to this member (normally one).
        self._assigned: dict[str, set[str]] = {}
        self._on_change(0, [Event(False, e.kv)
                            for e in keyspace.prefixed(layout.assignments)])
        self.stop = keyspace.observe(self._on_change)

    def _on_change(self, revision: int, events: list[Event]) -> None:
        prefix = self.layout.assignments
        for ev in events:
            key = ev.kv.key
            if not key.startswith(prefix):
                continue
            item, sep, _ = key[len(prefix):].rpartition(self._mine)
            if not sep:
                continue
            if ev.deleted:
                keys = self._assigned.get(item)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del self._assigned[item]
            else:
                self._assigned.setdefault(item, set()).add(key)

    def spec(self, item: str) -> SpecT | None:
        """The spec of `item` (None: there is none)."""
        entry = self.keyspace.get(self.layout.item_key(item))
        return entry.value if entry is not None and isinstance(entry.value, self.spec_type) \
            else None

    def resolve(self, item: str, *, announced: bool = False) -> Resolution[SpecT]:
        """Where `item` is served; with `announced`, also whether its primary's
        announcement of the route is in every assignment (requests need not know)."""
        spec = self.spec(item)
        assigned = assignments_of(self.keyspace, self.layout, item) if spec is not None \
            else []
        route = route_of(assigned) if spec is not None else EMPTY_ROUTE
        held = True
        if announced:
            value = route.encode()
            held = all(a.value == value for a in assigned)
        endpoints, data = self._endpoints(route)
        return Resolution(item, spec, route, endpoints, self.keyspace.revision, held, data)

    def statuses(self, item: str, route: Route) -> tuple[ReplicaStatus, ...]:
        """The status each member of `route` wrote for its replica of `item` (PENDING:
        none written yet), index-aligned with `route.members`."""
        out = []
        for m in route.members:
            entry = self.keyspace.get(self.layout.status_key(item, m.zone, m.suffix))
            out.append(entry.value if entry is not None and isinstance(entry.value,
                                                                      ReplicaStatus)
                       else ReplicaStatus())
        return tuple(out)

    def _endpoints(self, route: Route) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Each member's endpoint, and data endpoint (() if none has one)."""
        out, data = [], []
        for m in route.members:
            entry = self.keyspace.get(self.layout.member_key(m.zone, m.suffix))
            spec = entry.value if entry is not None and isinstance(entry.value, MemberSpec) \
                else None
            out.append(spec.endpoint if spec is not None else "")
            data.append(spec.data_endpoint if spec is not None else "")
        return tuple(out), tuple(data) if any(data) else ()

    async def resolve_at(self, item: str, header: pb.Header | None) -> Resolution[SpecT]:
        """As `resolve`, once this member has caught up with the etcd revision of a
        request's `header` (waiting at most a few seconds for it). A revision etcd has
        not reached is refused: `ValidationError` naming ``header.etcd.revision``."""
        if header is not None and header.etcd.revision > self.keyspace.revision:
            wanted = header.etcd.revision
            try:
                current = await self.keyspace.current_revision(wanted)
            except EtcdError:
                current = wanted  # etcd cannot say now: wait (bounded) as for any
            if wanted > current:
                raise ValidationError("header.etcd.revision", (
                    f"{wanted} is ahead of etcd, which is at revision {current}: a header "
                    "must come from a response of this cluster"))
            with contextlib.suppress(TimeoutError):
                await self.keyspace.wait_for_revision(wanted, timeout=REVISION_WAIT_SECONDS)
        return self.resolve(item)

    def assigned(self) -> set[str]:
        """Items with an assignment to this member (any slot)."""
        return set(self._assigned)

    def is_assigned(self, item: str) -> bool:
        return item in self._assigned

    def header(self, res: Resolution[Any] | None = None) -> pb.Header:
        """The response header: this member, the item's route, the revision."""
        if res is None:
            return pb.Header(process_id=self.me_pb,
                             etcd=pb.Header.Etcd(revision=self.keyspace.revision))
        route = res.route.to_pb(with_endpoints=False)
        route.endpoints.extend(res.endpoints)
        route.data_endpoints.extend(res.data_endpoints)
        return pb.Header(process_id=self.me_pb, route=route,
                         etcd=pb.Header.Etcd(revision=res.revision))
