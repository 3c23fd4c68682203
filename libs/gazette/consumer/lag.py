"""A shard's lag behind its source journals, in bytes and in time.

Bytes (``gazette_consumer_lag_bytes``): the write head its reads last saw, less the
offset its last transaction committed through. Time (``gazette_consumer_lag_seconds``):
how long ago the oldest byte not yet committed was appended, as far as this member can
tell: it notes when its reads first saw the head pass each point (at most twice a
second), and the age of the first note past the committed offset is the lag. Computed at
each scrape, so a shard that stopped committing shows its lag grow.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
import time
import weakref
from collections.abc import Iterator

from prometheus_client import REGISTRY, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

LAG_BYTES = Gauge("gazette_consumer_lag_bytes",
                  "Bytes of a shard's source journal past its last committed transaction "
                  "(as of the write head its reads last saw)", ["shard", "journal"])

#: Seconds between two notes of a journal's head: the lag's resolution.
NOTE_SECONDS = 0.5
#: Notes kept per journal (a shard far behind keeps every other one beyond this).
MAX_NOTES = 4096


class _Journal:
    """Notes of when the head of one source journal passed which offsets."""

    __slots__ = ("committed", "heads", "times")

    def __init__(self, committed: int) -> None:
        self.committed = committed
        self.heads: list[int] = []
        self.times: list[float] = []

    def saw(self, head: int, now: float) -> None:
        if head <= (self.heads[-1] if self.heads else self.committed):
            return
        if self.times and now - self.times[-1] < NOTE_SECONDS:
            return  # the newest note stands for these bytes too (within its resolution)
        self.heads.append(head)
        self.times.append(now)
        if len(self.heads) > MAX_NOTES:
            del self.heads[::2], self.times[::2]

    def commit(self, offset: int) -> None:
        self.committed = offset
        drop = bisect.bisect_right(self.heads, offset)
        if drop:
            del self.heads[:drop], self.times[:drop]

    def seconds(self, now: float) -> float:
        return now - self.times[0] if self.heads else 0.0


class ShardLag:
    """The lag of shard `shard`: told the heads its reads see and what it commits."""

    def __init__(self, shard: str) -> None:
        self.shard = shard
        self._journals: dict[str, _Journal] = {}
        self._heads: dict[str, int] = {}

    def saw_head(self, journal: str, head: int) -> None:
        self._heads[journal] = head
        state = self._journals.get(journal)
        if state is not None:
            state.saw(head, time.monotonic())

    def committed(self, offsets: dict[str, int]) -> None:
        """A transaction (or the restored checkpoint) committed through `offsets`; it is
        reported from then on, until `close`."""
        LAGS.add(self)
        for journal, offset in offsets.items():
            state = self._journals.get(journal)
            if state is None:
                state = self._journals[journal] = _Journal(offset)
            state.commit(offset)
            if (head := self._heads.get(journal)) is not None:
                state.saw(head, time.monotonic())
                LAG_BYTES.labels(self.shard, journal).set(max(0, head - offset))

    def close(self) -> None:
        """The shard stopped here: another member reports its lag from now on."""
        LAGS.discard(self)
        for journal in self._journals:
            with contextlib.suppress(KeyError):
                LAG_BYTES.remove(self.shard, journal)
        self._journals.clear()
        self._heads.clear()

    def seconds(self) -> Iterator[tuple[str, float]]:
        now = time.monotonic()
        for journal, state in list(self._journals.items()):
            yield journal, state.seconds(now)


class _Lags(Collector):
    def __init__(self) -> None:
        self._lags: weakref.WeakSet[ShardLag] = weakref.WeakSet()
        self._lock = threading.Lock()

    def add(self, lag: ShardLag) -> None:
        with self._lock:
            self._lags.add(lag)

    def discard(self, lag: ShardLag) -> None:
        with self._lock:
            self._lags.discard(lag)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "gazette_consumer_lag_seconds", "Age of the oldest content of a shard's source "
            "journal its transactions have not committed yet (0: caught up)",
            labels=["shard", "journal"])
        with self._lock:
            lags = list(self._lags)
        for lag in lags:
            for journal, seconds in lag.seconds():
                family.add_metric([lag.shard, journal], seconds)
        yield family


LAGS = _Lags()
REGISTRY.register(LAGS)
