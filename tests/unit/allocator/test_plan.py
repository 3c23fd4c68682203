"""The leader's plan: additions at once; removals and slot changes of an item only once
it has all its members and they are consistent; assignments of gone items removed."""

from __future__ import annotations

from gazette.allocator import Assignment, MemberState, Solution, State, plan
from gazette.keyspace import Layout
from gazette.protocol import MemberSpec, ProcessId

LAYOUT = Layout("/t")
A, B, C = ProcessId("z1", "a"), ProcessId("z1", "b"), ProcessId("z2", "c")


def member(pid: ProcessId, lease: int) -> MemberState:
    return MemberState(MemberSpec(pid, f"http://{pid.suffix}:1"), f"/t/members/{pid}", lease,
                       lease)


def assignment(item: str, m: ProcessId, slot: int) -> Assignment:
    key = LAYOUT.assignment_key(item, m.zone, m.suffix, slot)
    return Assignment(item, m, slot, b"", key, 10 + slot)


def state(assignments: dict[str, list[Assignment]]) -> State:
    return State(100, {"j/one": 2, "j/two": 1},
                 {A: member(A, 1), B: member(B, 2), C: member(C, 3)}, assignments)


def test_additions_go_first_and_removals_wait_for_consistency() -> None:
    st = state({"j/one": [assignment("j/one", A, 0), assignment("j/one", B, 1)],
                "j/gone": [assignment("j/gone", A, 0)]})
    sol = Solution({"j/one": (A, C), "j/two": (B,)}, added=2, removed=1)
    first = plan(st, LAYOUT, sol, lambda *_: False)
    assert sorted(first.puts) == sorted([
        (LAYOUT.assignment_key("j/one", "z2", "c", 1), 3),
        (LAYOUT.assignment_key("j/two", "z1", "b", 0), 2)])
    # The gone item's assignment goes at once; j/one's extra one waits (C is not in yet).
    assert [a.item for a in first.deletes] == ["j/gone"]
    assert first.waiting == 1

    # C is in; still inconsistent: nothing more; consistent: B goes.
    st = state({"j/one": [assignment("j/one", A, 0), assignment("j/one", B, 1),
                          assignment("j/one", C, 1)]})
    held = plan(st, LAYOUT, sol, lambda *_: False)
    assert held.deletes == [] and held.waiting == 1
    second = plan(st, LAYOUT, sol, lambda *_: True)
    assert [(a.item, a.member) for a in second.deletes] == [("j/one", B)]


def test_a_primary_change_rewrites_both_slots_once_consistent() -> None:
    st = state({"j/one": [assignment("j/one", A, 0), assignment("j/one", C, 1)]})
    sol = Solution({"j/one": (C, A), "j/two": ()}, added=0, removed=0)
    steps = plan(st, LAYOUT, sol)
    key = LAYOUT.assignment_key
    assert sorted(a.key for a in steps.deletes) == sorted(
        [key("j/one", "z1", "a", 0), key("j/one", "z2", "c", 1)])
    assert sorted(k for k, _ in steps.puts) == sorted(
        [key("j/one", "z2", "c", 0), key("j/one", "z1", "a", 1)])


def test_an_item_whose_primary_died_gets_one_at_once() -> None:
    # A (the primary) is gone: B is promoted now, without waiting for consistency
    # (with no primary, nothing could make the item consistent).
    st = state({"j/one": [assignment("j/one", B, 1)]})
    st.members.pop(A)
    sol = Solution({"j/one": (B, C), "j/two": ()}, added=1, removed=0)
    steps = plan(st, LAYOUT, sol, lambda *_: False)
    key = LAYOUT.assignment_key
    assert sorted(k for k, _ in steps.puts) == sorted(
        [key("j/one", "z1", "b", 0), key("j/one", "z2", "c", 1)])
    assert [a.key for a in steps.deletes] == [key("j/one", "z1", "b", 1)]


def test_a_newcomer_never_makes_a_second_primary() -> None:
    # The solution makes C primary while A still is: C joins at a spare slot first, and
    # takes slot 0 only when A's removal may happen too.
    st = state({"j/two": [assignment("j/two", A, 0)]})
    sol = Solution({"j/one": (), "j/two": (C,)}, added=1, removed=1)
    steps = plan(st, LAYOUT, sol, lambda *_: False)
    [(put, _)] = steps.puts
    assert LAYOUT.parse(put).slot > 0 and steps.deletes == []  # type: ignore[union-attr]
    st = state({"j/two": [assignment("j/two", A, 0), assignment("j/two", C, 2)]})
    steps = plan(st, LAYOUT, sol, lambda *_: True)
    assert [k for k, _ in steps.puts] == [LAYOUT.assignment_key("j/two", "z2", "c", 0)]
    assert sorted(a.member.suffix for a in steps.deletes) == ["a", "c"]
