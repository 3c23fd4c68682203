"""Routes: who holds a journal (or shard), and which of them is primary.

One type serves everyone: the allocator builds routes from assignments (without
endpoints) and compares them; brokers attach each member's endpoint when they answer;
clients read both from response headers. An assignment's value is a route encoded
without endpoints, so routes compare equal whatever endpoints a broker attached only if
both carry the same ones: compare routes of one origin.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from gazette.errors import ValidationError
from gazette.pb import broker_pb2 as pb
from gazette.protocol.member_spec import ProcessId


@dataclass(frozen=True, slots=True)
class Route:
    """`members` sorted by (zone, suffix); `primary` indexes the slot-0 member (-1:
    none); `endpoints` of the members, index-aligned (empty where not known)."""

    members: tuple[ProcessId, ...] = ()
    primary: int = -1
    endpoints: tuple[str, ...] = ()

    @property
    def primary_id(self) -> ProcessId | None:
        return self.members[self.primary] if 0 <= self.primary < len(self.members) else None

    @property
    def primary_endpoint(self) -> str:
        """The primary's endpoint ("" if none or not known)."""
        return self.endpoints[self.primary] if 0 <= self.primary < len(self.endpoints) else ""

    def endpoint_of(self, member: ProcessId) -> str:
        """`member`'s endpoint ("" if not a member or not known)."""
        try:
            i = self.members.index(member)
        except ValueError:
            return ""
        return self.endpoints[i] if i < len(self.endpoints) else ""

    def with_endpoints(self, endpoints: Sequence[str]) -> Route:
        return replace(self, endpoints=tuple(endpoints))

    def encode(self) -> bytes:
        """The route as an assignment value (a `Route` message without endpoints)."""
        return self.to_pb(with_endpoints=False).SerializeToString()

    def to_pb(self, *, with_endpoints: bool = True) -> pb.Route:
        return pb.Route(members=[pb.ProcessSpec.ID(zone=m.zone, suffix=m.suffix)
                                 for m in self.members],
                        primary=self.primary,
                        endpoints=list(self.endpoints) if with_endpoints else [])

    def __str__(self) -> str:
        return "[" + ", ".join(f"{m}{'*' if i == self.primary else ''}"
                               for i, m in enumerate(self.members)) + "]"


EMPTY_ROUTE = Route()


def route_from_pb(msg: pb.Route, field: str = "route") -> Route:
    """The route of a `Route` message; `ValidationError` naming `field` if a member is
    not a valid process id, the primary is out of range or the endpoints do not align."""
    try:
        members = tuple(ProcessId(m.zone, m.suffix) for m in msg.members)
    except ValidationError as err:
        raise err.within(f"{field}.members") from None
    if not -1 <= msg.primary < len(members):
        raise ValidationError(f"{field}.primary", f"{msg.primary} is not a member's index")
    if msg.endpoints and len(msg.endpoints) != len(members):
        raise ValidationError(f"{field}.endpoints", f"{len(msg.endpoints)} endpoints for "
                              f"{len(members)} members")
    return Route(members, msg.primary, tuple(msg.endpoints))
