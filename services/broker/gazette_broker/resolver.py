"""Where a journal is served: its spec and route as this broker's keyspace says, at a
revision, and the response header that tells clients so."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from gazette.allocator import EMPTY_ROUTE, Route, assignments_of, route_of
from gazette.keyspace import KeySpace, Layout
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

    @property
    def primary_endpoint(self) -> str:
        return self.endpoints[self.route.primary] if self.route.primary >= 0 else ""


class Resolver:
    """Resolves journals against `keyspace` for the broker `me`."""

    def __init__(self, keyspace: KeySpace[Any], layout: Layout, me: ProcessId) -> None:
        self.keyspace, self.layout, self.me = keyspace, layout, me
        self.me_pb = pb.ProcessSpec.ID(zone=me.zone, suffix=me.suffix)

    def resolve(self, journal: str) -> Resolution:
        entry = self.keyspace.get(self.layout.item_key(journal))
        spec = entry.value if entry is not None and isinstance(entry.value, JournalSpec) \
            else None
        route = route_of(assignments_of(self.keyspace, self.layout, journal)) \
            if spec is not None else EMPTY_ROUTE
        return Resolution(journal, spec, route, self._endpoints(route), self.keyspace.revision)

    def _endpoints(self, route: Route) -> tuple[str, ...]:
        out = []
        for m in route.members:
            entry = self.keyspace.get(self.layout.member_key(m.zone, m.suffix))
            out.append(entry.value.endpoint
                       if entry is not None and isinstance(entry.value, MemberSpec) else "")
        return tuple(out)

    async def resolve_at(self, journal: str, header: pb.Header | None) -> Resolution:
        """As `resolve`, once this broker has caught up with the etcd revision of a
        request's `header` (waiting at most a few seconds for it)."""
        if header is not None and header.etcd.revision > self.keyspace.revision:
            with contextlib.suppress(TimeoutError):
                await self.keyspace.wait_for_revision(header.etcd.revision,
                                                      timeout=REVISION_WAIT_SECONDS)
        return self.resolve(journal)

    def assigned(self) -> set[str]:
        """Journals with an assignment to this broker (any slot)."""
        prefix = self.layout.assignments
        mine = f"#{self.me.zone}#{self.me.suffix}#"
        out = set()
        for entry in self.keyspace.prefixed(prefix):
            item, sep, _ = entry.kv.key[len(prefix):].rpartition(mine)
            if sep:
                out.add(item)
        return out

    def header(self, res: Resolution | None = None) -> pb.Header:
        """The response header: this broker, the journal's route, the revision."""
        if res is None:
            return pb.Header(process_id=self.me_pb,
                             etcd=pb.Header.Etcd(revision=self.keyspace.revision))
        return pb.Header(process_id=self.me_pb,
                         route=res.route.with_endpoints(res.endpoints).to_pb(),
                         etcd=pb.Header.Etcd(revision=res.revision))

