"""The etcd key layout: keys built, and parsed back into their parts (or rejected)."""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.errors import ValidationError
from gazette.keyspace.layout import (
    BROKER_ROOT,
    CONSUMER_ROOT,
    AssignmentKey,
    ItemKey,
    Layout,
    MemberKey,
    StatusKey,
)

BROKERS = Layout.brokers()


def test_broker_keys() -> None:
    assert BROKERS.root == BROKER_ROOT == "/gazette/cluster"
    assert BROKERS.items == "/gazette/cluster/items/"
    assert BROKERS.members == "/gazette/cluster/members/"
    assert BROKERS.assignments == "/gazette/cluster/assign/"
    assert BROKERS.item_key("example/journal") == "/gazette/cluster/items/example/journal"
    assert BROKERS.member_key("local", "busy-walrus") == (
        "/gazette/cluster/members/local#busy-walrus")
    assert BROKERS.assignment_key("example/journal", "local", "busy-walrus", 0) == (
        "/gazette/cluster/assign/example/journal#local#busy-walrus#0")
    assert BROKERS.item_assignments("example/journal") == (
        "/gazette/cluster/assign/example/journal#")


def test_status_keys_parse_back() -> None:
    app = Layout.consumer_app("word-count")
    key = app.status_key("word-count/part-000", "zone-a", "m0")
    assert key == "/gazette/consumers/word-count/status/word-count/part-000#zone-a#m0"
    assert key.startswith(app.item_statuses("word-count/part-000"))
    assert app.parse(key) == StatusKey("word-count/part-000", "zone-a", "m0")
    with pytest.raises(ValidationError, match="not an item, member, assignment or status"):
        app.parse(app.statuses + "part#zone-a#m0#0")


def test_consumer_app_keys() -> None:
    app = Layout.consumer_app("word-count")
    assert app.root == f"{CONSUMER_ROOT}/word-count"
    assert app.item_key("s/1") == "/gazette/consumers/word-count/items/s/1"
    assert Layout.consumer_app("x", root="/other").root == "/other/x"


@pytest.mark.parametrize(
    ("key", "parsed"),
    [
        ("/gazette/cluster/items/example/journal", ItemKey("example/journal")),
        ("/gazette/cluster/items/s", ItemKey("s")),
        ("/gazette/cluster/members/local#busy-walrus", MemberKey("local", "busy-walrus")),
        ("/gazette/cluster/assign/example/journal#local#busy-walrus#0",
         AssignmentKey("example/journal", "local", "busy-walrus", 0)),
        ("/gazette/cluster/assign/a/b#z.1#s_2#12", AssignmentKey("a/b", "z.1", "s_2", 12)),
    ],
)
def test_parse(key: str, parsed: object) -> None:
    assert BROKERS.parse(key) == parsed


@pytest.mark.parametrize(
    "key",
    [
        "",
        "/gazette/cluster",
        "/gazette/cluster/",
        "/gazette/cluster/items/",
        "/gazette/clusterX/items/a/b",
        "/gazette/other/items/a/b",
        "gazette/cluster/items/a/b",
        "/gazette/cluster/unknown/a",
        "/gazette/cluster/members/",
        "/gazette/cluster/members/local",
        "/gazette/cluster/members/#s",
        "/gazette/cluster/members/z#",
        "/gazette/cluster/members/z#s#x",
        "/gazette/cluster/members/z z#s",
        "/gazette/cluster/assign/a/b#z#s",
        "/gazette/cluster/assign/a/b#z#s#",
        "/gazette/cluster/assign/#z#s#0",
        "/gazette/cluster/assign/a/b##s#0",
        "/gazette/cluster/assign/a/b#z##0",
        "/gazette/cluster/assign/a/b#z#s#x",
        "/gazette/cluster/assign/a/b#z#s#-1",
        "/gazette/cluster/assign/a/b#z#s#+1",
        "/gazette/cluster/assign/a/b#z#s#01",
        "/gazette/cluster/assign/a/b#z#s# 1",
        "/gazette/cluster/assign/a/b#z#s#\u00b2",  # SUPERSCRIPT TWO: isdigit(), not int()
        "/gazette/cluster/assign/a/b#z#s#\u0661",  # ARABIC-INDIC DIGIT ONE
        "/gazette/cluster/assign/a/b#z#s#0#0",
        "/gazette/cluster/items/a#b",
        "/gazette/cluster/items/a//b",
        "/gazette/cluster/items//a",
        "/gazette/cluster/items/a/",
        "/gazette/cluster/items/a/../b",
        "/gazette/cluster/assign/a//b#z#s#0",
        "/gazette/cluster/assign/a/b#z/x#s#0",
    ],
)
def test_malformed_keys(key: str) -> None:
    with pytest.raises(ValidationError) as info:
        BROKERS.parse(key)
    assert info.value.field == "key"
    assert repr(key) in info.value.reason


@pytest.mark.parametrize("key", [None, b"/gazette/cluster/items/a/b", 3])
def test_non_string_keys(key: object) -> None:
    with pytest.raises(ValidationError) as info:
        BROKERS.parse(key)  # type: ignore[arg-type]
    assert info.value.field == "key" and "expected a string" in info.value.reason


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: Layout("gazette"), "etcd.prefix"),
        (lambda: Layout("/"), "etcd.prefix"),
        (lambda: Layout("/gazette/"), "etcd.prefix"),
        (lambda: Layout("/a#b"), "etcd.prefix"),
        (lambda: Layout.consumer_app(""), "app"),
        (lambda: Layout.consumer_app("a//b"), "app"),
        (lambda: Layout.consumer_app("a#b"), "app"),
        (lambda: Layout.consumer_app("app", root="relative"), "etcd.prefix"),
    ],
)
def test_bad_layouts(make: object, field: str) -> None:
    assert callable(make)
    with pytest.raises(ValidationError) as info:
        make()
    assert info.value.field == field and info.value.reason


# --- round trips ------------------------------------------------------------------------

_ALNUM = string.ascii_letters + string.digits
components = st.text(_ALNUM + "-_+%", min_size=1, max_size=6)
item_names = st.lists(components, min_size=1, max_size=4).map("/".join).filter(
    lambda n: len(n) >= 2)
tokens = st.text(_ALNUM + "-_.", min_size=1, max_size=8)
layouts = st.sampled_from([BROKERS, Layout.consumer_app("word-count"), Layout("/x")])


@settings(max_examples=200, deadline=None)
@given(layouts, item_names, tokens, tokens, st.integers(0, 2**40))
def test_keys_round_trip_through_parse(
    layout: Layout, item: str, zone: str, suffix: str, slot: int
) -> None:
    assert layout.parse(layout.item_key(item)) == ItemKey(item)
    assert layout.parse(layout.member_key(zone, suffix)) == MemberKey(zone, suffix)
    key = layout.assignment_key(item, zone, suffix, slot)
    assert layout.parse(key) == AssignmentKey(item, zone, suffix, slot)
    assert key.startswith(layout.item_assignments(item))


@settings(max_examples=200, deadline=None)
@given(layouts, st.text(max_size=40))
def test_parse_never_escapes(layout: Layout, tail: str) -> None:
    for prefix in (layout.items, layout.members, layout.assignments, layout.root, ""):
        try:
            parsed = layout.parse(prefix + tail)
        except ValidationError as err:
            assert err.field == "key" and err.reason
            continue
        # Whatever parses formats back to the very same key.
        if isinstance(parsed, ItemKey):
            assert layout.item_key(parsed.item) == prefix + tail
        elif isinstance(parsed, MemberKey):
            assert layout.member_key(parsed.zone, parsed.suffix) == prefix + tail
        else:
            assert layout.assignment_key(
                parsed.item, parsed.zone, parsed.suffix, parsed.slot) == prefix + tail
