"""What gazctl says when one batch of a batched apply fails: which batches (and so which
journals, by their place in the input) were applied, and which were not."""

from __future__ import annotations

from gazette.gazctl.apply import partial_failure
from gazette.protocol import JournalSpec
from gazette.protocol.trees import SpecChange

CHANGES: list[SpecChange[JournalSpec]] = [SpecChange(f"p/j-{i:04d}", 0, None)
                                          for i in range(250)]


def test_a_refused_batch_and_those_after_it_were_not_applied() -> None:
    assert partial_failure(CHANGES, 100, 1, "p/j-0150 already exists", 42) == (
        "batch 2 of 3 was not applied: p/j-0150 already exists; batch 1 was applied "
        "(changes 1-100: p/j-0000 to p/j-0099; revision 42); not applied: batches 2-3 "
        "(changes 101-250: p/j-0100 to p/j-0249); list the journals again and re-apply "
        "those")
    assert partial_failure(CHANGES, 100, 0, "stale", 0) == (
        "batch 1 of 3 was not applied: stale; no batch was applied; list the journals "
        "again and re-apply your changes")


def test_an_unreachable_broker_leaves_its_batch_uncertain() -> None:
    assert partial_failure(CHANGES, 100, 1, "UNAVAILABLE", 42, uncertain=True) == (
        "batch 2 of 3 failed and may or may not have been applied: UNAVAILABLE; batch 1 "
        "was applied (changes 1-100: p/j-0000 to p/j-0099; revision 42); it held changes "
        "101-200: p/j-0100 to p/j-0199; not applied: batch 3 (changes 201-250: p/j-0200 "
        "to p/j-0249); list the journals again and re-apply those")
    last = partial_failure(CHANGES, 100, 2, "UNAVAILABLE", 43, uncertain=True)
    assert "batches 1-2 were applied (changes 1-200" in last
    assert "it held changes 201-250: p/j-0200 to p/j-0249; list the journals" in last
    assert "not applied" not in last
