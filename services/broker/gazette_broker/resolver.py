"""Where a journal is served: its spec and route as this broker's keyspace says, at a
revision, and the response header that tells clients so.

The journals assigned to this broker are followed incrementally from the keyspace's
changes (one set of keys), so asking costs nothing however many journals the cluster
has. A request pinned to an etcd revision this broker has not reached waits for it,
briefly, but only for a revision etcd has reached: a client naming one far ahead is
refused at once, instead of stalling requests.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from gazette.allocator import EMPTY_ROUTE, Route, assignments_of, route_of
from gazette.errors import ValidationError
from gazette.keyspace import EtcdError, Event, KeySpace, Layout
from gazette.pb import broker_pb2 as pb
from gazette.protocol import JournalSpec, MemberSpec, ProcessId

#: How long a request pinned to a newer etcd revision waits for this broker to catch up.
REVISION_WAIT_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class Resolution:
    """A journal's `spec` (None: no such journal) and `route`, with each route member's
    endpoint, as of etcd `revision`."""

    journal: str
    spec: JournalSpec | None
    route: Route
    endpoints: tuple[str, ...]
    revision: int
    #: Whether every assignment holds `route` as its value (the primary announced it
    #: and no assignment was added or moved since).
    announced: bool = True

    @property
    def primary_endpoint(self) -> str:
        return self.endpoints[self.route.primary] if self.route.primary >= 0 else ""


class Resolver:
    """Resolves journals against `keyspace` for the broker `me`."""

    def __init__(self, keyspace: KeySpace[Any], layout: Layout, me: ProcessId) -> None:
        self.keyspace, self.layout, self.me = keyspace, layout, me
        self.me_pb = pb.ProcessSpec.ID(zone=me.zone, suffix=me.suffix)
        self._mine = f"#{me.zone}#{me.suffix}#"
        #: Journal -> its assignment keys to this broker (normally one).
        self._assigned: dict[str, set[str]] = {}
        self._track(list(keyspace.prefixed(layout.assignments)))
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

    def _track(self, entries: list[Any]) -> None:
        self._on_change(0, [Event(False, e.kv) for e in entries])

    def resolve(self, journal: str, *, announced: bool = False) -> Resolution:
        """Where `journal` is served; with `announced`, also whether its primary's
        announcement of the route is in every assignment (requests need not know)."""
        entry = self.keyspace.get(self.layout.item_key(journal))
        spec = entry.value if entry is not None and isinstance(entry.value, JournalSpec) \
            else None
        assigned = assignments_of(self.keyspace, self.layout, journal) if spec is not None \
            else []
        route = route_of(assigned) if spec is not None else EMPTY_ROUTE
        held = True
        if announced:
            value = route.encode()
            held = all(a.value == value for a in assigned)
        return Resolution(journal, spec, route, self._endpoints(route), self.keyspace.revision,
                          held)

    def _endpoints(self, route: Route) -> tuple[str, ...]:
        out = []
        for m in route.members:
            entry = self.keyspace.get(self.layout.member_key(m.zone, m.suffix))
            out.append(entry.value.endpoint
                       if entry is not None and isinstance(entry.value, MemberSpec) else "")
        return tuple(out)

    async def resolve_at(self, journal: str, header: pb.Header | None) -> Resolution:
        """As `resolve`, once this broker has caught up with the etcd revision of a
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
        return self.resolve(journal)

    def assigned(self) -> set[str]:
        """Journals with an assignment to this broker (any slot)."""
        return set(self._assigned)

    def is_assigned(self, journal: str) -> bool:
        return journal in self._assigned

    def header(self, res: Resolution | None = None) -> pb.Header:
        """The response header: this broker, the journal's route, the revision."""
        if res is None:
            return pb.Header(process_id=self.me_pb,
                             etcd=pb.Header.Etcd(revision=self.keyspace.revision))
        route = res.route.to_pb(with_endpoints=False)
        route.endpoints.extend(res.endpoints)
        return pb.Header(process_id=self.me_pb, route=route,
                         etcd=pb.Header.Etcd(revision=res.revision))
