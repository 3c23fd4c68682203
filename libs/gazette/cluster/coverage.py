"""How well the cluster's items are served, as a member's view of etcd says: the metric
``gazette_cluster_items{kind, state}`` counts items (journals or shards) that are
``ok``, have ``no_primary``, or are ``under_replicated`` (fewer live members assigned
than their spec asks for). Every member reports it, computed at each scrape from its
keyspace mirror (no task, nothing stale); alerts aggregate with ``max``.

Counting answers "is anything unserved?" at any number of items; which ones are is
``gazctl journals list`` / ``gazctl shards list``, as the runbooks say.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from collections.abc import Iterator

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gazette.allocator import Allocator, read_state

OK, NO_PRIMARY, UNDER_REPLICATED = "ok", "no_primary", "under_replicated"
STATES = (OK, NO_PRIMARY, UNDER_REPLICATED)


def item_states(allocator: Allocator) -> Counter[str]:
    """Items of `allocator`'s keyspace by state (disabled items, of replication 0, are
    left out: nothing should serve them)."""
    state = read_state(allocator.keyspace, allocator.layout, allocator.replication_of)
    out: Counter[str] = Counter({s: 0 for s in STATES})
    for item, replication in state.items.items():
        if replication <= 0:
            continue
        live = [a for a in state.assignments.get(item, ()) if a.member in state.members]
        if not any(a.slot == 0 for a in live):
            out[NO_PRIMARY] += 1
        elif len({a.member for a in live}) < replication:
            out[UNDER_REPLICATED] += 1
        else:
            out[OK] += 1
    return out


class _Coverage(Collector):
    """The members of this process (normally one; tests run several), by item kind."""

    def __init__(self) -> None:
        self._members: weakref.WeakKeyDictionary[Allocator, str] = \
            weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def add(self, allocator: Allocator, kind: str) -> None:
        with self._lock:
            self._members[allocator] = kind

    def discard(self, allocator: Allocator) -> None:
        with self._lock:
            self._members.pop(allocator, None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "gazette_cluster_items", "Items (journals, shards) by whether they are served "
            "as their specs ask, as this member's view of etcd says", labels=["kind", "state"])
        with self._lock:
            members = list(self._members.items())
        worst: dict[tuple[str, str], int] = {}
        for allocator, kind in members:
            if not allocator.keyspace.revision:
                continue  # not loaded yet: it would say nothing exists
            for state, n in item_states(allocator).items():
                # (members of one kind in one process see one etcd: the same counts,
                # but one may lag; the higher says a problem sooner)
                worst[kind, state] = max(worst.get((kind, state), 0), n)
        for (kind, state), n in sorted(worst.items()):
            family.add_metric([kind, state], n)
        yield family


COVERAGE = _Coverage()
REGISTRY.register(COVERAGE)
