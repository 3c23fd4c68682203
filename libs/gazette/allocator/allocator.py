"""The allocator over etcd: every member runs one; the leader writes assignments.

The leader is the member whose key has the lowest create revision (ties: the lowest
key), so leadership passes on, without an election, when the leader's lease ends. On
each change of the keyspace the leader reads the items, members and assignments it
mirrors (`State`), solves (`gazette.allocator.solver`), and converges etcd towards the
solution in transactions that each compare the leader's own member key (a leader that
lost its lease writes nothing) and every assignment key they touch (nothing written
from a stale view).

Assignments are added first and removed only later: an assignment that is no longer
wanted (its member is exiting, or the items are rebalanced) is removed only once every
current assignment of its item is consistent (`is_consistent`: for brokers, each replica
has acknowledged the item's current route), so an item never drops below what its
replicas have agreed on. Assignment keys live under their member's lease: a member that
dies takes its assignments with it, and the leader re-places them.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter

from gazette.allocator.solver import Member, Solution, solve
from gazette.errors import ValidationError
from gazette.keyspace import Etcd, Event, KeySpace, Layout, Txn, TxnConflict
from gazette.keyspace.etcd import KeyValue
from gazette.keyspace.layout import AssignmentKey
from gazette.protocol import MemberSpec, ProcessId

log = logging.getLogger(__name__)

CONVERGES = Counter("gazette_allocator_converges_total",
                    "Leader passes that wrote assignment changes")
ASSIGNMENT_OPS = Counter("gazette_allocator_assignment_ops_total",
                         "Assignment keys written by this member as leader", ["op"])

#: Operations per etcd transaction (etcd's default limit is 128, and the leader's own
#: key and every touched key are compared too).
MAX_TXN_OPS = 48


@dataclass(frozen=True, slots=True)
class Assignment:
    """An item's assignment to a member, as stored: its slot (0 is primary), value
    (what the member acknowledged, for `is_consistent`) and etcd revisions."""

    item: str
    member: ProcessId
    slot: int
    value: bytes
    key: str
    mod_revision: int


@dataclass(frozen=True, slots=True)
class MemberState:
    """A member as stored: its spec, key, create revision and lease."""

    spec: MemberSpec
    key: str
    create_revision: int
    lease: int


@dataclass(frozen=True, slots=True)
class State:
    """What the allocator needs of a keyspace, at one revision."""

    revision: int
    items: dict[str, int]  # item → replication
    members: dict[ProcessId, MemberState]
    assignments: dict[str, list[Assignment]]  # item → by slot, then member
    #: item → members that cannot serve it (they lack a kind of store it needs)
    excluded: dict[str, frozenset[ProcessId]] = field(default_factory=dict)

    @property
    def leader(self) -> ProcessId | None:
        """The member with the lowest create revision (then key)."""
        if not self.members:
            return None
        return min(self.members.values(), key=lambda m: (m.create_revision, m.key)).spec.id

    def current(self) -> dict[str, list[ProcessId]]:
        return {item: [a.member for a in assigned]
                for item, assigned in self.assignments.items()}


IsConsistent = Callable[[str, Assignment, Sequence[Assignment]], bool]


def always_consistent(item: str, assignment: Assignment,
                      assignments: Sequence[Assignment]) -> bool:
    return True


StoresOf = Callable[[Any], tuple[str, ...]]


def read_state(keyspace: KeySpace[Any], layout: Layout,
               replication_of: Callable[[Any], int], stores_of: StoresOf | None = None
               ) -> State:
    """The items (with their replication), live members and assignments of `keyspace`.
    Assignments of items or members that are gone are listed too (under their item):
    the solver drops them and the leader deletes them. `stores_of(spec)`: the stores
    an item's members must serve (journals' fragment stores)."""
    items: dict[str, int] = {}
    stores: dict[str, tuple[str, ...]] = {}
    members: dict[ProcessId, MemberState] = {}
    assignments: dict[str, list[Assignment]] = defaultdict(list)
    # The mirror's keys were checked as they were decoded: split, not parsed again.
    for entry in keyspace.prefixed(layout.items):
        item = entry.kv.key[len(layout.items):]
        items[item] = replication_of(entry.value)
        if stores_of is not None:
            stores[item] = stores_of(entry.value)
    for entry in keyspace.prefixed(layout.members):
        spec = entry.value
        members[spec.id] = MemberState(spec, entry.kv.key, entry.kv.create_revision,
                                       entry.kv.lease)
    ids = {(m.zone, m.suffix): m for m in members}
    prefix = len(layout.assignments)
    for entry in keyspace.prefixed(layout.assignments):
        kv = entry.kv
        item, zone, suffix, slot = kv.key[prefix:].rsplit("#", 3)
        member = ids.get((zone, suffix)) or ProcessId(zone, suffix)
        assignments[item].append(Assignment(item, member, int(slot), kv.value, kv.key,
                                            kv.mod_revision))
    for assigned in assignments.values():
        assigned.sort(key=lambda a: (a.slot, a.member))
    return State(keyspace.revision, items, members, dict(assignments),
                 _excluded(stores, members))


def _excluded(stores: dict[str, tuple[str, ...]], members: dict[ProcessId, MemberState]
              ) -> dict[str, frozenset[ProcessId]]:
    """Items (with stores) → the members that cannot serve those stores."""
    limited = [m for m in members.values() if m.spec.store_schemes]
    if not limited:
        return {}
    by_stores: dict[tuple[str, ...], frozenset[ProcessId]] = {}
    out = {}
    for item, urls in stores.items():
        unable = by_stores.get(urls)
        if unable is None:
            unable = by_stores[urls] = frozenset(
                m.spec.id for m in limited if not m.spec.serves_stores(urls))
        if unable:
            out[item] = unable
    return out


def assignments_of(keyspace: KeySpace[Any], layout: Layout, item: str) -> list[Assignment]:
    """The assignments of one `item` in `keyspace`, by slot then member."""
    return assignments_from(layout, item,
                            [e.kv for e in keyspace.prefixed(layout.item_assignments(item))])


def assignments_from(layout: Layout, item: str, kvs: Sequence[KeyValue]) -> list[Assignment]:
    """The assignments of one `item` from its keys under ``layout.item_assignments``
    (a keyspace's, or a range read's), by slot then member."""
    prefix = layout.item_assignments(item)
    out = []
    for kv in kvs:
        zone, suffix, slot = kv.key[len(prefix):].split("#")
        out.append(Assignment(item, ProcessId(zone, suffix), int(slot), kv.value, kv.key,
                              kv.mod_revision))
    out.sort(key=lambda a: (a.slot, a.member))
    return out


@dataclass
class Plan:
    """The operations that move etcd towards a solution, in what may go now."""

    puts: list[tuple[str, int]]  # (assignment key, its member's lease)
    deletes: list[Assignment]
    waiting: int  # removals held back until their items are consistent
    waiting_items: set[str] = field(default_factory=set)  # the items of those

    def __bool__(self) -> bool:
        return bool(self.puts or self.deletes)


def plan(state: State, layout: Layout, solution: Solution,
         is_consistent: IsConsistent = always_consistent) -> Plan:
    """Additions now; removals (and slot changes) of an item only once it has every
    member it should have and all its current assignments are consistent."""
    puts: list[tuple[str, int]] = []
    deletes: list[Assignment] = []
    waiting = 0
    waiting_items: set[str] = set()

    def move(moved: list[tuple[Assignment, int]]) -> None:
        for a, slot in moved:  # a new key at the new slot, the old one deleted
            deletes.append(a)
            puts.append((layout.assignment_key(a.item, a.member.zone, a.member.suffix,
                                               slot), state.members[a.member].lease))

    for item in sorted(set(state.assignments) | set(solution.assignments)):
        current = state.assignments.get(item, [])
        desired = solution.assignments.get(item, ())
        held = {a.member for a in current}
        adds = [(slot, m) for slot, m in enumerate(desired) if m not in held]
        has_primary = any(a.slot == 0 and a.member in state.members for a in current)
        for slot, m in adds:
            if slot == 0 and has_primary:
                # Never two primaries: the newcomer waits at a spare slot, and is
                # promoted when the current primary may leave.
                slot = len(desired) + max((a.slot for a in current), default=0)
            puts.append((layout.assignment_key(item, m.zone, m.suffix, slot),
                         state.members[m].lease))
        item_gone = item not in state.items
        stale = [a for a in current
                 if a.member not in desired or a.member not in state.members
                 or item_gone]
        moved = [(a, desired.index(a.member)) for a in current
                 if a not in stale and desired.index(a.member) != a.slot]
        if not stale and not moved:
            continue
        ready = item_gone or (not adds and all(
            is_consistent(item, a, current) for a in current if a.member in state.members))
        if not ready:
            # An item without a primary (it died) gets one at once: a slot change
            # removes no replica, and without a primary nothing makes it consistent.
            if not has_primary:
                move(moved)
                moved = []
            waiting += len(stale) + len(moved)
            waiting_items.add(item)
            continue
        deletes.extend(stale)
        move(moved)
    return Plan(puts, deletes, waiting, waiting_items)


class Allocator:
    """Runs the allocator for the member `me` (whose spec is under `layout`, kept by a
    lease the caller owns): follows `keyspace`, and while `me` leads, converges the
    assignments. `replication_of` reads an item's replication from its decoded spec."""

    def __init__(self, etcd: Etcd, keyspace: KeySpace[Any], layout: Layout, me: ProcessId,
                 replication_of: Callable[[Any], int] = lambda spec: int(spec.replication),
                 is_consistent: IsConsistent = always_consistent,
                 stores_of: StoresOf | None = None) -> None:
        """`stores_of(spec)`: the stores an item's members must serve (None: items
        need nothing of their members)."""
        self.etcd, self.keyspace, self.layout, self.me = etcd, keyspace, layout, me
        self.replication_of = replication_of
        self.is_consistent = is_consistent
        self.stores_of = stores_of
        self._changed = asyncio.Event()
        self.converged = asyncio.Event()  # set while the leader has nothing left to do
        #: Items whose removals wait for their assignments to be consistent: only
        #: their assignments' values matter to the next pass.
        self._waiting: set[str] = set()
        #: What of each item the solution depends on (replication, stores).
        self._inputs: dict[str, tuple[int, tuple[str, ...]]] = {}

    def state(self) -> State:
        return read_state(self.keyspace, self.layout, self.replication_of, self.stores_of)

    def leader(self) -> ProcessId | None:
        """The member with the lowest create revision (then key), as `State.leader`."""
        entries = [e for e in self.keyspace.prefixed(self.layout.members)
                   if isinstance(e.value, MemberSpec)]
        if not entries:
            return None
        first = min(entries, key=lambda e: (e.kv.create_revision, e.kv.key))
        return first.value.id  # type: ignore[no-any-return]

    async def run(self) -> None:
        """Until cancelled: after each keyspace change that may change the assignments,
        converge if `me` leads. etcd failing ends it with `EtcdError` (its owner starts
        it again after a while)."""
        stop = self.keyspace.observe(self._on_change)
        for entry in self.keyspace.prefixed(self.layout.items):  # what changes matter
            self._inputs[entry.kv.key[len(self.layout.items):]] = self._inputs_of(entry.value)
        try:
            self._changed.set()
            while True:
                await self._changed.wait()
                self._changed.clear()
                try:
                    await self.converge()
                except TxnConflict as err:
                    # Someone wrote meanwhile (or leadership moved): our view was
                    # stale. The watch brings the change; try again from there.
                    log.debug("allocator: %s", err)
                    await self.keyspace.wait_for_revision(err.revision, timeout=30)
                    self._changed.set()
        finally:
            stop()

    def _on_change(self, revision: int, events: list[Event]) -> None:
        # Every event is looked at (not `any`): `_matters` keeps `_inputs` current.
        if sum(self._matters(ev) for ev in events):
            self._changed.set()

    def _matters(self, ev: Event) -> bool:
        """Whether a change may change what the leader writes: members, items'
        replication or stores, assignments coming or going, and acknowledgments of
        items whose removals wait for them. Acknowledgments of settled items and spec
        edits of nothing else (labels, say) cost nothing. Replica statuses matter as
        acknowledgments do."""
        key = ev.kv.key
        layout = self.layout
        if key.startswith(layout.members):
            return True
        if key.startswith(layout.items):
            item = key[len(layout.items):]
            entry = None if ev.deleted else self.keyspace.get(key)
            if entry is None:
                return self._inputs.pop(item, None) is not None or ev.deleted
            inputs = self._inputs_of(entry.value)
            if self._inputs.get(item) == inputs:
                return False
            self._inputs[item] = inputs
            return True
        if key.startswith(layout.assignments):
            if ev.deleted or ev.kv.version == 1:
                return True  # an assignment came or went
            return key[len(layout.assignments):].rsplit("#", 3)[0] in self._waiting
        if key.startswith(layout.statuses):  # a replica's readiness, for `is_consistent`
            return key[len(layout.statuses):].rsplit("#", 2)[0] in self._waiting
        return False

    def _inputs_of(self, spec: Any) -> tuple[int, tuple[str, ...]]:
        return (self.replication_of(spec), self.stores_of(spec) if self.stores_of else ())

    async def converge(self) -> bool:
        """One leader pass: solve and write what may be written now. Returns whether
        anything was written (the watch then triggers the next pass)."""
        if self.leader() != self.me:  # (from the members alone: cheap for the others)
            self.converged.clear()
            return False
        state = self.state()
        if state.leader != self.me:
            self.converged.clear()
            return False
        limits = [Member(m.spec.id, m.spec.item_limit) for m in state.members.values()]
        solution = solve(state.items, limits, state.current(), state.excluded)
        steps = plan(state, self.layout, solution, self.is_consistent)
        self._waiting = steps.waiting_items
        if not steps:
            if steps.waiting:
                log.debug("allocator: %d removals wait for consistency", steps.waiting)
                self.converged.clear()
            else:
                self.converged.set()
            return False
        self.converged.clear()
        revision = await self._apply(state, steps)
        CONVERGES.inc()
        log.info("allocator: %d assignments added, %d removed (revision %d)",
                 len(steps.puts), len(steps.deletes), revision)
        await self.keyspace.wait_for_revision(revision, timeout=30)
        return True

    async def _apply(self, state: State, steps: Plan) -> int:
        leader_key = state.members[self.me].key
        leader_rev = self.keyspace.get(leader_key)
        if leader_rev is None:
            raise ValidationError("member", f"{self.me} has no member key")
        # An item's operations (a slot change is a delete and a put) stay in one
        # transaction, so no reader sees half of them.
        by_item: dict[str, list[tuple[str, Any]]] = defaultdict(list)
        for a in steps.deletes:
            by_item[a.item].append(("delete", a))
        for put in steps.puts:
            parsed = self.layout.parse(put[0])
            assert isinstance(parsed, AssignmentKey)
            by_item[parsed.item].append(("put", put))
        batches: list[list[tuple[str, Any]]] = [[]]
        for ops in by_item.values():
            if batches[-1] and len(batches[-1]) + len(ops) > MAX_TXN_OPS:
                batches.append([])
            batches[-1].extend(ops)
        revision = state.revision
        for batch in batches:
            txn = Txn().expect(leader_key, leader_rev.kv.mod_revision)
            for op, arg in batch:
                if op == "delete":
                    txn.expect(arg.key, arg.mod_revision).delete(arg.key)
                else:
                    key, lease = arg
                    txn.expect(key, 0).put(key, b"", lease=lease)
                ASSIGNMENT_OPS.labels(op).inc()
            revision = (await txn.commit(self.etcd)).revision
        return revision
