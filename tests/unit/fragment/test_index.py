"""The fragment index: sorted, minimal cover sets; reads find the right fragment."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.fragment.fragment import EMPTY_SHA1, Fragment
from gazette.fragment.index import FragmentSet, JournalClosed, JournalIndex, from_listing

ranges = st.tuples(st.integers(0, 60), st.integers(1, 25)).map(lambda t: (t[0], t[0] + t[1]))


def frag(begin: int, end: int, store: str = "", mod_time: int = 0) -> Fragment:
    return Fragment("j/x", begin, end, EMPTY_SHA1, backing_store=store, mod_time=mod_time)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(ranges, st.booleans()), max_size=25))
def test_sets_stay_sorted_minimal_and_readable(adds: list[tuple[tuple[int, int], bool]]
                                               ) -> None:
    fs = FragmentSet()
    added = []
    for (b, e), persisted in adds:
        f = frag(b, e, "s3://bucket/" if persisted else "")
        fs.add(f)
        added.append(f)
    items = list(fs)
    assert items == sorted(items, key=lambda f: (f.begin, f.end))
    assert not any(a is not b and a.begin <= b.begin and b.end <= a.end
                   for a in items for b in items)  # minimal: none covered by another
    for offset in range(0, 90):
        holders = [f for f in added if f.contains(offset)]
        found = fs.find(offset)
        if holders:
            assert found is not None and found.contains(offset)
            assert found.end == max(f.end for f in holders)
        elif found is not None:
            assert found.begin > offset  # skipping a hole forward
    if added:
        assert fs.end_offset == max(f.end for f in added)


def test_persisted_replaces_a_local_fragment_of_the_same_range() -> None:
    fs = FragmentSet([frag(0, 10)])
    assert fs.add(frag(0, 10, "file:///"))
    assert [f.backing_store for f in fs] == ["file:///"]
    assert not fs.add(frag(0, 10))  # a local copy does not displace the persisted one
    assert not fs.add(frag(2, 5, "file:///"))  # covered
    assert fs.add(frag(5, 15))  # overlapping, not covered: kept
    assert [(f.begin, f.end) for f in fs] == [(0, 10), (5, 15)]
    assert fs.find(7) == frag(5, 15)  # reaches further
    assert fs.remove(frag(5, 15)) and not fs.remove(frag(5, 15))


def test_replace_persisted_keeps_locals_not_yet_listed() -> None:
    index = JournalIndex("j/x")
    index.add(frag(0, 10))
    index.add(frag(10, 20))
    index.replace_persisted([frag(0, 10, "s3://b/")], None)
    assert [(f.begin, f.end, f.backing_store) for f in index.fragments()] == [
        (0, 10, "s3://b/"), (10, 20, "")]
    index.replace_persisted([frag(0, 20, "s3://b/")], None)
    assert [(f.begin, f.end) for f in index.fragments()] == [(0, 20)]
    assert index.find(15) == frag(0, 20, "s3://b/")
    assert JournalIndex("other/journal").find(0) is None


def test_a_stale_listing_never_forgets_a_fragment_persisted_meanwhile() -> None:
    """A listing that began before a fragment was persisted lacks it: the index keeps
    what it learned (the bug: it dropped it, and reads skipped its bytes)."""
    index = JournalIndex("j/x")
    index.replace_persisted([frag(0, 10, "s3://b/", mod_time=1000)], None)
    index.add(frag(10, 20))  # the open spool's content...
    index.add(frag(10, 20, "s3://b/", mod_time=2000))  # ...persisted while a listing ran
    index.replace_persisted([frag(0, 10, "s3://b/", mod_time=1000)], None)  # stale
    assert [(f.begin, f.end, f.backing_store) for f in index.fragments()] == [
        (0, 10, "s3://b/"), (10, 20, "s3://b/")]
    assert index.covers(0, 20)
    # With retention, a fragment the listing lacks goes only once retention proves it
    # removed (its mod time is before the cutoff).
    index.replace_persisted([], cutoff=1500)
    assert [(f.begin, f.end) for f in index.fragments()] == [(10, 20)]
    index.replace_persisted([], cutoff=2500)
    assert list(index.fragments()) == []


async def test_wait_for_resolves_when_content_arrives() -> None:
    index = JournalIndex("j/x")
    waiter = asyncio.create_task(index.wait_for(10, timeout=5))
    await asyncio.sleep(0)
    index.add(frag(0, 10))  # ends at 10: offset 10 still not readable
    await asyncio.sleep(0)
    assert not waiter.done()
    index.add(frag(10, 12))
    await asyncio.wait_for(waiter, 5)
    with pytest.raises(TimeoutError):
        await index.wait_for(100, timeout=0.05)
    assert not index._waiters  # a wait that timed out leaves nothing behind


async def test_a_closed_index_ends_every_wait() -> None:
    """A replica closed (journal deleted or moved) ends its blocking reads: waits raise
    at once instead of returning (the bug: a reader spun at 100 % CPU)."""
    index = JournalIndex("j/x")
    index.add(frag(0, 10))
    waiter = asyncio.create_task(index.wait_for(10))
    changed = asyncio.create_task(index.wait_changed(60))
    await asyncio.sleep(0)
    index.close("deleted")
    for task in (waiter, changed):
        with pytest.raises(JournalClosed, match="j/x: deleted"):
            await asyncio.wait_for(task, 5)
    with pytest.raises(JournalClosed):
        await index.wait_for(0)  # even where content is: the journal is gone here


def test_listing_skips_what_is_not_a_fragment() -> None:
    good = frag(0, 4).path
    found = from_listing([(good, 1700000000), ("j/x/README", 1), ("junk", 2)], "file:///")
    assert found == [Fragment("j/x", 0, 4, EMPTY_SHA1, backing_store="file:///",
                              mod_time=1700000000)]
