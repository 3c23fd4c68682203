"""Routes: who holds an item, and which of them is primary, as its assignments say.

A route is what replicas agree on before an item's membership may shrink: each assigned
member writes the route it has acknowledged into its assignment's value, and the item is
*consistent* when every value equals the route of the assignments as they are now
(`route_consistent`, the broker's `IsConsistent`).
"""

from __future__ import annotations

from collections.abc import Sequence

from gazette.allocator.allocator import Assignment
from gazette.protocol.route import EMPTY_ROUTE, Route, route_from_pb

__all__ = ["EMPTY_ROUTE", "Route", "route_consistent", "route_from_pb", "route_of"]


def route_of(assignments: Sequence[Assignment]) -> Route:
    """The route of an item's assignments (of one item, any order)."""
    members = tuple(sorted({a.member for a in assignments}))
    primary = next((members.index(a.member) for a in assignments if a.slot == 0), -1)
    return Route(members, primary)


def route_consistent(item: str, assignment: Assignment,
                     assignments: Sequence[Assignment]) -> bool:
    """Whether `assignment`'s member has acknowledged the item's current route."""
    return assignment.value == route_of(assignments).encode()
