"""The allocator: items (journals, shards) assigned to members (brokers, consumers) with
replication, zone spread, member limits, balance and little churn.

`solve` is the pure part: current assignments in, desired assignments out.
"""

from gazette.allocator.solver import Member, Solution, solve

__all__ = ["Member", "Solution", "solve"]
