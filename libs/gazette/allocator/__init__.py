"""The allocator: items (journals, shards) assigned to members (brokers, consumers) with
replication, zone spread, member limits, balance and little churn.

`solve` is the pure part: current assignments in, desired assignments out. `Allocator`
runs it over etcd: every member runs one, the leader writes the assignments (`plan`:
additions first, removals once an item is consistent).
"""

from gazette.allocator.allocator import (
    Allocator,
    Assignment,
    IsConsistent,
    MemberState,
    Plan,
    State,
    always_consistent,
    assignments_from,
    assignments_of,
    plan,
    read_state,
)
from gazette.allocator.route import (
    EMPTY_ROUTE,
    Route,
    route_consistent,
    route_from_pb,
    route_of,
)
from gazette.allocator.solver import Member, Solution, solve

__all__ = [
    "EMPTY_ROUTE",
    "Allocator",
    "Assignment",
    "IsConsistent",
    "Member",
    "MemberState",
    "Plan",
    "Route",
    "Solution",
    "State",
    "always_consistent",
    "assignments_from",
    "assignments_of",
    "plan",
    "read_state",
    "route_consistent",
    "route_from_pb",
    "route_of",
    "solve",
]
