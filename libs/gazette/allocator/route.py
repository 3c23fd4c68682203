"""Routes: who holds an item, and which of them is primary, as its assignments say.

A route is what replicas agree on before an item's membership may shrink: each assigned
member writes the route it has acknowledged into its assignment's value, and the item is
*consistent* when every value equals the route of the assignments as they are now
(`route_consistent`, the broker's `IsConsistent`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gazette.allocator.allocator import Assignment
from gazette.pb import broker_pb2 as pb
from gazette.protocol import ProcessId


@dataclass(frozen=True, slots=True)
class Route:
    """`members` sorted by (zone, suffix); `primary` indexes the slot-0 member (-1:
    none)."""

    members: tuple[ProcessId, ...] = ()
    primary: int = -1

    @property
    def primary_id(self) -> ProcessId | None:
        return self.members[self.primary] if self.primary >= 0 else None

    def encode(self) -> bytes:
        """The route as an assignment value (a `Route` message without endpoints)."""
        return self.to_pb().SerializeToString()

    def to_pb(self, endpoints: Sequence[str] = ()) -> pb.Route:
        return pb.Route(members=[pb.ProcessSpec.ID(zone=m.zone, suffix=m.suffix)
                                 for m in self.members],
                        primary=self.primary, endpoints=list(endpoints))

    def __str__(self) -> str:
        return "[" + ", ".join(f"{m}{'*' if i == self.primary else ''}"
                               for i, m in enumerate(self.members)) + "]"


EMPTY_ROUTE = Route()


def route_of(assignments: Sequence[Assignment]) -> Route:
    """The route of an item's assignments (of one item, any order)."""
    members = tuple(sorted({a.member for a in assignments}))
    primary = next((members.index(a.member) for a in assignments if a.slot == 0), -1)
    return Route(members, primary)


def route_consistent(item: str, assignment: Assignment,
                     assignments: Sequence[Assignment]) -> bool:
    """Whether `assignment`'s member has acknowledged the item's current route."""
    return assignment.value == route_of(assignments).encode()


def route_from_pb(msg: pb.Route) -> Route:
    """The route of a `Route` message (endpoints dropped); `ValidationError` if a member
    is not a valid process id or the primary is out of range."""
    from gazette.errors import ValidationError

    members = tuple(ProcessId(m.zone, m.suffix) for m in msg.members)
    if not -1 <= msg.primary < len(members):
        raise ValidationError("route.primary", f"{msg.primary} is not a member's index")
    return Route(members, msg.primary)
