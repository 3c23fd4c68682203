"""The allocator's solver: which members should hold each item.

Given items (each with a replication), members (each with a zone and an item limit) and
the current assignments, `solve` returns the desired assignments. It is a maximum flow
(source → item, capacity its replication; item → member, capacity 1; member → sink,
capacity its limit), reached in passes that keep it cheap and keep churn low:

1. **keep** every current assignment that is still valid: its member is alive with a
   limit above zero, it is not a duplicate, the item needs it, the member is within its
   limit (an over-full member sheds its newest assignments);
2. **spread**: an item with two or more replicas all in one zone, while another zone
   has a member with room, gives up one (it is placed in another zone next);
3. **fill** each missing replica on the member with the lowest load relative to its
   limit, preferring zones the item is not in yet (a heap per zone: no scan of every
   member per replica);
4. **augment**: a replica that found no member with room takes one whose item can move
   elsewhere, along an augmenting path (breadth-first over members): what greedy
   filling missed, the flow's maximum still gets;
5. **balance**: while moving one assignment from a member above its fair share (the
   total of assignments split in proportion to limits) to one below narrows the spread,
   move one (keeping zone spread), the furthest apart first: a member that joins takes
   about its fair share and no more moves than that;
6. **respread**: an item balancing left in one zone moves a replica to another zone
   with room.

Replica order: a kept primary (slot 0) stays primary, unless its member is primary for
more than its share of items; otherwise the kept replica (a standby) whose member is
primary for the fewest items becomes it, and a fresh one only when none is kept. Zone
spread is a preference the flow may overflow: an item is put in one zone only when no
other zone has room for it.
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from gazette.protocol import ProcessId


@dataclass(frozen=True, slots=True)
class Member:
    """A member the solver may assign items to: `limit` items at most (0: none, as for
    a member that is exiting)."""

    id: ProcessId
    limit: int


@dataclass(frozen=True, slots=True)
class Solution:
    """Desired members of each item (slot order: the first is primary), and what
    changed against the current assignments."""

    assignments: dict[str, tuple[ProcessId, ...]]
    added: int  # (item, member) pairs not currently assigned
    removed: int  # current (item, member) pairs no longer assigned

    def load(self) -> dict[ProcessId, int]:
        out: dict[ProcessId, int] = defaultdict(int)
        for members in self.assignments.values():
            for m in members:
                out[m] += 1
        return dict(out)


class _State:
    """Working state: per-item member lists, per-member item sets and loads."""

    def __init__(self, items: Mapping[str, int], members: Sequence[Member],
                 excluded: Mapping[str, AbstractSet[ProcessId]] | None = None) -> None:
        self.replication = dict(items)
        self.excluded = excluded or {}
        self.limit = {m.id: m.limit for m in members if m.limit > 0}
        self.zone_of = {m: m.zone for m in self.limit}
        self.zones = sorted({m.zone for m in self.limit})
        self.members_of: dict[str, list[ProcessId]] = {item: [] for item in items}
        self.items_of: dict[ProcessId, set[str]] = {m: set() for m in self.limit}
        total_limit = sum(self.limit.values())
        demand = sum(min(r, len(self.limit)) for r in items.values())
        # Fair share: the demand split in proportion to limits (a float; loads are ints).
        self.target = {m: demand * lim / total_limit if total_limit else 0.0
                       for m, lim in self.limit.items()}

    def room(self, m: ProcessId) -> bool:
        return len(self.items_of[m]) < self.limit[m]

    def ok(self, item: str, m: ProcessId) -> bool:
        """Whether `m` may hold `item` at all (it can serve the item's stores)."""
        return m not in self.excluded.get(item, ())

    def add(self, item: str, m: ProcessId) -> None:
        self.members_of[item].append(m)
        self.items_of[m].add(item)

    def remove(self, item: str, m: ProcessId) -> None:
        self.members_of[item].remove(m)
        self.items_of[m].discard(item)

    def zones_of(self, item: str) -> set[str]:
        return {m.zone for m in self.members_of[item]}

    def spread_ok(self, item: str, without: ProcessId | None = None,
                  adding: ProcessId | None = None) -> bool:
        """Whether `item` (minus `without`, plus `adding`) spans two zones, as it must
        when it has two or more replicas and two zones exist."""
        members = [m for m in self.members_of[item] if m != without]
        if adding is not None:
            members.append(adding)
        return len(self.zones) < 2 or len(members) < 2 or len({m.zone for m in members}) > 1

    def deviation(self, m: ProcessId) -> float:
        """How far `m`'s load is above its fair share, in items."""
        return len(self.items_of[m]) - self.target[m]


def solve(items: Mapping[str, int], members: Sequence[Member],
          current: Mapping[str, Sequence[ProcessId]] | None = None,
          excluded: Mapping[str, AbstractSet[ProcessId]] | None = None) -> Solution:
    """The desired assignments of `items` (item → replication) to `members`, given the
    `current` assignments (item → members in slot order); `excluded`: item → members
    that must not hold it."""
    current = current or {}
    st = _State(items, members, excluded)
    _keep(st, current)
    _spread(st)
    _fill(st)
    _augment(st)
    _balance(st)
    while _respread(st):  # each round leaves fewer items in one zone: it ends
        _balance(st)
    return _result(st, current)


def _keep(st: _State, current: Mapping[str, Sequence[ProcessId]]) -> None:
    for item, r in st.replication.items():
        for m in current.get(item, ()):
            if m in st.limit and m not in st.members_of[item] and \
                    len(st.members_of[item]) < r and st.ok(item, m):
                st.add(item, m)
    # An over-full member (its limit lowered) sheds what it took last.
    for m, lim in st.limit.items():
        excess = len(st.items_of[m]) - lim
        if excess > 0:
            for item in sorted(st.items_of[m])[-excess:]:
                st.remove(item, m)


def _spread(st: _State) -> None:
    """Items with all their replicas in one zone give one up (not the primary), to be
    refilled in another zone, as far as other zones have room for them."""
    if len(st.zones) < 2:
        return
    room = {z: 0 for z in st.zones}
    for m, lim in st.limit.items():
        room[m.zone] += max(lim - len(st.items_of[m]), 0)
    for item, ms in sorted(st.members_of.items()):
        # An item missing replicas gets its other zone from filling, at no cost.
        if len(ms) >= max(2, st.replication[item]) and len({m.zone for m in ms}) == 1:
            zone = ms[0].zone
            other = next((z for z in st.zones if z != zone and room[z] > 0), None)
            if other is not None:
                room[other] -= 1
                st.remove(item, ms[-1])  # not the primary; refilled in another zone


def _fill(st: _State) -> None:
    """Greedy: each missing replica on the least-loaded member with room, preferring a
    zone the item is not in yet."""
    heaps: dict[str, list[tuple[float, ProcessId]]] = {z: [] for z in st.zones}
    for m in st.limit:
        if st.room(m):
            heaps[m.zone].append((_ratio(st, m), m))
    for heap in heaps.values():
        heapq.heapify(heap)

    def take(zones: Iterable[str], item: str) -> ProcessId | None:
        """The least-loaded member with room in `zones` not holding `item`, taken out
        of its heap (the caller pushes it back while it has room). Each member has one
        entry, so keys are current; full members are dropped for good (fill only adds)."""
        skipped: list[tuple[str, tuple[float, ProcessId]]] = []
        found: tuple[float, int, ProcessId] | None = None
        in_zone: dict[str, int] = defaultdict(int)
        for m in st.members_of[item]:
            in_zone[m.zone] += 1
        for z in zones:
            heap = heaps[z]
            while heap:
                key, m = heap[0]
                if not st.room(m):
                    heapq.heappop(heap)
                elif item in st.items_of[m] or not st.ok(item, m):
                    skipped.append((z, heapq.heappop(heap)))
                else:
                    # Equally loaded members: the zone holding fewer of the item's
                    # replicas wins, so items spread over every zone (and losing a
                    # member later leaves each of its items free to refill anywhere).
                    if found is None or (key, in_zone[z], m) < found:
                        found = (key, in_zone[z], m)
                    break
        if found is not None:
            heapq.heappop(heaps[found[2].zone])
        for z, entry in skipped:
            heapq.heappush(heaps[z], entry)
        return None if found is None else found[2]

    for item in sorted(st.members_of):
        need = st.replication[item] - len(st.members_of[item])
        for _ in range(max(need, 0)):
            used = st.zones_of(item)
            chosen: ProcessId | None = None
            if len(st.zones) >= 2 and len(used) < 2:
                chosen = take([z for z in st.zones if z not in used], item)
            if chosen is None:
                chosen = take(st.zones, item)
            if chosen is None:
                break
            st.add(item, chosen)
            if st.room(chosen):
                heapq.heappush(heaps[chosen.zone], (_ratio(st, chosen), chosen))


def _ratio(st: _State, m: ProcessId) -> float:
    return (len(st.items_of[m]) + 1) / st.limit[m]


def _augment(st: _State) -> None:
    """Maximum flow: for each missing replica that greedy filling could not place, an
    augmenting path item → full member → (an item it holds moves) → ... → a member with
    room. Paths that keep every moved item's zone spread are tried first; failing those,
    any path (zone spread is what overflows, never replication)."""
    for item in sorted(st.members_of):
        while len(st.members_of[item]) < st.replication[item]:
            if not (_augment_one(st, item, spread=True) or
                    _augment_one(st, item, spread=False)):
                break


def _augment_one(st: _State, item: str, spread: bool) -> bool:
    # BFS over members. A step into member `m` for item `it` means: `it` is placed on
    # `m`; if `m` is full, one of `m`'s items moves on (the next step).
    parent: dict[ProcessId, tuple[ProcessId | None, str]] = {}
    queue: deque[ProcessId] = deque()
    for m in st.limit:
        if item not in st.items_of[m] and st.ok(item, m) and (
                not spread or st.spread_ok(item, adding=m)):
            parent[m] = (None, item)
            queue.append(m)
    while queue:
        m = queue.popleft()
        if st.room(m):
            # Apply the path backwards: each item moves into the member after it.
            while True:
                prev, it = parent[m]
                if prev is not None:
                    st.remove(it, prev)
                st.add(it, m)
                if prev is None:
                    return True
                m = prev
        for it in sorted(st.items_of[m]):
            for m2 in st.limit:
                if m2 not in parent and it not in st.items_of[m2] and st.ok(it, m2) and (
                        not spread or st.spread_ok(it, without=m, adding=m2)):
                    parent[m2] = (m, it)
                    queue.append(m2)
    return False


def _balance(st: _State) -> None:
    """Move single assignments from members above their fair share to members below it,
    the furthest first, while a move narrows the spread (the gap between the two exceeds
    one item). A pair that cannot trade (zone spread, or every item already on the
    receiver) is passed over for the next."""
    # Pairs (from, to) found unable to trade: they stay so until `from` takes an item
    # (its items only shrink otherwise, and `to` only fills up).
    blocked: set[tuple[ProcessId, ProcessId]] = set()
    while True:
        overs = sorted(st.limit, key=lambda m: (-st.deviation(m), m))
        unders = sorted((m for m in st.limit if st.room(m)),
                        key=lambda m: (st.deviation(m), m))
        if not unders or not _move_some(st, overs, unders, blocked):
            return


def _move_some(st: _State, overs: list[ProcessId], unders: list[ProcessId],
               blocked: set[tuple[ProcessId, ProcessId]]) -> bool:
    """One move into the member furthest below its share that can take one (from the
    furthest above first), so that a joining member is filled from the others rather
    than the others trading among themselves."""
    for under in unders:
        if st.deviation(overs[0]) - st.deviation(under) <= 1.0 + 1e-9:
            return False  # members further up the list are closer still
        for over in overs:
            if st.deviation(over) - st.deviation(under) <= 1.0 + 1e-9:
                break
            if (over, under) in blocked:
                continue
            if _move_one(st, over, under):
                for pair in [p for p in blocked if p[0] == under]:
                    blocked.discard(pair)
                return True
            blocked.add((over, under))
    return False


def _move_one(st: _State, src: ProcessId, dst: ProcessId) -> bool:
    """Move one item from `src` to `dst`: not one `dst` holds, and keeping the item's
    zone spread; a replica that is not primary if there is one."""
    cross_zone = len(st.zones) >= 2 and src.zone != dst.zone
    fallback: str | None = None
    dst_items = st.items_of[dst]
    for it in st.items_of[src]:
        if it in dst_items or not st.ok(it, dst):
            continue
        ms = st.members_of[it]
        if cross_zone and len(ms) >= 2 and not any(
                m.zone != dst.zone for m in ms if m != src):
            continue  # it would be left in `dst`'s zone alone
        if ms[0] != src:
            fallback = it
            break
        if fallback is None:
            fallback = it
    if fallback is None:
        return False
    st.remove(fallback, src)
    st.add(fallback, dst)
    return True


def _respread(st: _State) -> bool:
    """An item still in one zone with two or more replicas (balancing may have made
    room since) moves one replica, not its primary, to the least-loaded member of
    another zone with room. Returns whether anything moved."""
    moved = False
    if len(st.zones) < 2:
        return moved
    for item in sorted(st.members_of):
        ms = st.members_of[item]
        if len(ms) < 2 or len({m.zone for m in ms}) > 1:
            continue
        zone = ms[0].zone
        room = [m for m in st.limit if m.zone != zone and st.room(m) and st.ok(item, m)]
        if room:
            dst = min(room, key=lambda m: (st.deviation(m), m))
            st.remove(item, ms[-1])
            st.add(item, dst)
            moved = True
    return moved


def _result(st: _State, current: Mapping[str, Sequence[ProcessId]]) -> Solution:
    primaries: dict[ProcessId, int] = defaultdict(int)
    out: dict[str, tuple[ProcessId, ...]] = {}
    added = removed = 0
    order: list[tuple[str, list[ProcessId], list[ProcessId]]] = []
    for item in sorted(st.members_of):
        chosen = st.members_of[item]
        was = list(current.get(item, ()))
        kept = [m for m in was if m in chosen]
        added += len(set(chosen) - set(was))
        removed += len(set(was) - set(chosen))
        fresh = [m for m in chosen if m not in kept]
        if was and kept and kept[0] == was[0]:
            primaries[kept[0]] += 1  # the primary stays
            out[item] = (kept[0], *kept[1:], *fresh)
        else:
            order.append((item, kept, fresh))
    for item, kept, fresh in order:
        members = kept + fresh
        if not members:
            out[item] = ()
            continue
        # A replica it had (a standby, caught up) takes over before a fresh one.
        candidates = kept or fresh
        primary = min(candidates, key=lambda m: (primaries[m], candidates.index(m)))
        primaries[primary] += 1
        out[item] = (primary, *[m for m in members if m != primary])
    _balance_primaries(out, primaries, len(st.limit))
    removed += sum(len(set(ms)) for item, ms in current.items() if item not in st.members_of)
    return Solution(out, added, removed)


def _balance_primaries(out: dict[str, tuple[ProcessId, ...]],
                       primaries: dict[ProcessId, int], members: int) -> None:
    """A member primary for more than its share of items (say, the first member up,
    which got every item) hands some over to replicas that are primary for fewer."""
    led = [item for item, ms in out.items() if ms]
    if not led or members < 2:
        return
    share = -(-len(led) // members)  # ceil
    for item in sorted(led):
        ms = out[item]
        if primaries[ms[0]] <= share:
            continue
        takers = [m for m in ms[1:] if primaries[m] < share]
        if takers:
            new = min(takers, key=lambda m: (primaries[m], ms.index(m)))
            primaries[ms[0]] -= 1
            primaries[new] += 1
            out[item] = (new, *[m for m in ms if m != new])
