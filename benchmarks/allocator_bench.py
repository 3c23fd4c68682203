"""The allocator's solver at scale: 10,000 items, 100 members (three zones),
replication 3.

Prints progress, then one JSON object as its last line:

- ``solve_s``: a fresh solve (nothing assigned yet), the median of three;
- ``resolve_s``: solving again from that solution (nothing changes), the median of three;
- ``moves_after_member_loss`` / ``min_moves_after_member_loss``: assignments that move
  when one member goes, against what it held (the least that must move);
- ``moves_after_member_join`` / ``joined_member_load``: assignments that move when a
  member joins, against what it ends up holding (its share);
- ``max_load`` / ``min_load`` / ``single_zone_items`` of the fresh solution.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Mapping, Sequence

from gazette.allocator import Member, Solution, solve
from gazette.protocol import ProcessId

ITEMS, MEMBERS, REPLICATION, ZONES = 10_000, 100, 3, ("a", "b", "c")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def timed(items: dict[str, int], members: list[Member],
          current: Mapping[str, Sequence[ProcessId]] | None = None) -> tuple[float, Solution]:
    start = time.perf_counter()
    out = solve(items, members, current)
    return time.perf_counter() - start, out


def main() -> None:
    members = [Member(ProcessId(ZONES[i % len(ZONES)], f"broker-{i:03d}"), 1024)
               for i in range(MEMBERS)]
    items = {f"journal/part-{i:05d}": REPLICATION for i in range(ITEMS)}
    runs = [timed(items, members) for _ in range(3)]
    solve_s = statistics.median(t for t, _ in runs)
    fresh = runs[0][1]
    log(f"fresh solve: {solve_s:.3f} s")
    resolve_s = statistics.median(timed(items, members, fresh.assignments)[0]
                                  for _ in range(3))
    log(f"solve again from the solution: {resolve_s:.3f} s")
    loads = fresh.load()

    gone = members[len(members) // 2]
    t, lost = timed(items, [m for m in members if m != gone], fresh.assignments)
    log(f"member loss: {lost.removed} moves ({loads[gone.id]} held), {t:.3f} s")

    joined = Member(ProcessId("a", "broker-new"), 1024)
    t, grown = timed(items, [*members, joined], fresh.assignments)
    taken = grown.load()[joined.id]
    log(f"member join: {grown.removed} moves, it took {taken}, {t:.3f} s")

    print(json.dumps({
        "items": ITEMS, "members": MEMBERS, "replication": REPLICATION,
        "solve_s": round(solve_s, 3),
        "resolve_s": round(resolve_s, 3),
        "moves_after_member_loss": lost.removed,
        "min_moves_after_member_loss": loads[gone.id],
        "moves_after_member_join": grown.removed,
        "joined_member_load": taken,
        "max_load": max(loads.values()),
        "min_load": min(loads.values()),
        "single_zone_items": sum(1 for ms in fresh.assignments.values()
                                 if len({m.zone for m in ms}) < 2),
    }))


if __name__ == "__main__":
    main()
