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
    plan,
    read_state,
)
from gazette.allocator.solver import Member, Solution, solve

__all__ = [
    "Allocator",
    "Assignment",
    "IsConsistent",
    "Member",
    "MemberState",
    "Plan",
    "Solution",
    "State",
    "always_consistent",
    "plan",
    "read_state",
    "solve",
]
