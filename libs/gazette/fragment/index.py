"""The fragment index: which fragments of a journal a broker can read from.

A broker learns fragments from its own spools (local, not yet persisted) and from store
listings (persisted). `FragmentSet` keeps one journal's fragments sorted and minimal: a
fragment whose range another already covers is dropped (a persisted one wins over a local
one of the same range), while partly overlapping fragments are all kept (they appear when
a journal's peer set changes mid-fragment). `JournalIndex` holds one journal's set on a
broker and lets blocking reads wait for an offset to become readable.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
from collections.abc import Iterable, Iterator

from gazette.errors import GazetteError, ValidationError
from gazette.fragment.fragment import Fragment

log = logging.getLogger(__name__)


def _covers(a: Fragment, b: Fragment) -> bool:
    return a.begin <= b.begin and b.end <= a.end


class FragmentSet:
    """One journal's fragments, sorted by (begin, end), none covered by another."""

    def __init__(self, fragments: Iterable[Fragment] = ()) -> None:
        self._items: list[Fragment] = []
        self._keys: list[tuple[int, int]] = []
        for f in fragments:
            self.add(f)

    def __iter__(self) -> Iterator[Fragment]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    @property
    def begin_offset(self) -> int:
        return self._items[0].begin if self._items else 0

    @property
    def end_offset(self) -> int:
        return max((f.end for f in self._items), default=0)

    def add(self, fragment: Fragment) -> bool:
        """Add `fragment` unless another covers it; drop those it covers. Returns whether
        it was added."""
        items = self._items
        for other in items:
            if _covers(other, fragment):
                same_range = (other.begin, other.end) == (fragment.begin, fragment.end)
                if same_range and fragment.backing_store and not other.backing_store:
                    break  # the persisted copy replaces the local one
                return False
            if other.begin > fragment.begin:
                break
        keep = [f for f in items if not _covers(fragment, f)]
        if len(keep) != len(items):
            self._items = keep
            self._keys = [(f.begin, f.end) for f in keep]
        key = (fragment.begin, fragment.end)
        i = bisect.bisect_left(self._keys, key)
        self._items.insert(i, fragment)
        self._keys.insert(i, key)
        return True

    def remove(self, fragment: Fragment) -> bool:
        try:
            i = self._items.index(fragment)
        except ValueError:
            return False
        del self._items[i], self._keys[i]
        return True

    def find(self, offset: int) -> Fragment | None:
        """The fragment to read `offset` from: of those holding it, the one reaching
        furthest; if none holds it, the next one after it (the reader skips the hole,
        e.g. content removed by retention); None if nothing is at or after `offset`."""
        best = None
        i = bisect.bisect_right(self._keys, (offset, 1 << 63))
        for f in self._items[:i]:
            if f.contains(offset) and (best is None or f.end > best.end):
                best = f
        if best is None and i < len(self._items):
            best = self._items[i]
        return best


class JournalClosed(GazetteError):
    """The journal's replica on this broker was closed (the journal was deleted, or moved
    to other brokers): reads of it end."""


class JournalIndex:
    """One journal's `FragmentSet` on this broker, with waits for readable offsets.

    Each replica has its own: a journal deleted and created again gets a new index, so a
    reader of the old one never sees the new one's offsets. A persisted fragment stays
    known across store listings that lack it (a listing that began before it was
    persisted, say) until retention proves it removed: its mod time is before the
    retention cutoff. A reader therefore never skips persisted content because a
    listing was stale.
    """

    def __init__(self, journal: str) -> None:
        self.journal = journal
        self._set = FragmentSet()
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._closed: JournalClosed | None = None

    def fragments(self) -> FragmentSet:
        return self._set

    @property
    def end_offset(self) -> int:
        return self._set.end_offset

    def find(self, offset: int) -> Fragment | None:
        return self._set.find(offset)

    def add(self, fragment: Fragment) -> None:
        """A fragment of this broker's spool (local), or one it persisted."""
        self._set.add(fragment)
        self._wake()

    def replace_persisted(self, listed: Iterable[Fragment], cutoff: float | None,
                          expired: Iterable[Fragment] = ()) -> None:
        """A fresh listing of the stores replaces what was known persisted, except
        persisted fragments the listing lacks whose removal retention does not prove:
        neither listed past retention (`expired`) nor known to be older than `cutoff`
        (Unix seconds before which retention removes fragments; None: it keeps them for
        ever). Local fragments stay where the listing does not cover them yet."""
        fresh = FragmentSet(listed)
        gone = {(f.begin, f.end) for f in expired}
        for f in self._set:
            if not f.backing_store or ((f.begin, f.end) not in gone and (
                    cutoff is None or not f.mod_time or f.mod_time >= cutoff)):
                fresh.add(f)
        self._set = fresh
        self._wake()

    def covers(self, begin: int, end: int) -> bool:
        """Whether fragments hold every offset of [begin, end)."""
        offset = begin
        while offset < end:
            f = self.find(offset)
            if f is None or f.begin > offset:
                return False
            offset = f.end
        return True

    def close(self, reason: str) -> None:
        """End every wait, now and later, with `JournalClosed`."""
        self._closed = JournalClosed(f"{self.journal}: {reason}")
        for _, fut in self._waiters:
            if not fut.done():
                fut.set_exception(self._closed)
        self._waiters.clear()

    @property
    def closed(self) -> bool:
        return self._closed is not None

    async def wait_changed(self, timeout: float) -> None:
        """Return when the fragments change (or after `timeout`)."""
        with contextlib.suppress(TimeoutError):
            await self._wait(-1, timeout)

    async def wait_for(self, offset: int, timeout: float | None = None) -> None:
        """Return once content at or beyond `offset` is in the index."""
        if self.end_offset > offset and self._closed is None:
            return
        await self._wait(offset, timeout)

    async def _wait(self, offset: int, timeout: float | None) -> None:
        if self._closed is not None:
            raise self._closed
        waiter = (offset, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter[1]
        finally:
            waiter[1].cancel()
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)

    def _wake(self) -> None:
        if not self._waiters:
            return
        end = self.end_offset
        keep = []
        for offset, fut in self._waiters:
            if fut.done():
                continue
            if end > offset:
                fut.set_result(None)
            else:
                keep.append((offset, fut))
        self._waiters = keep


def from_listing(paths: Iterable[tuple[str, int]], store_url: str) -> list[Fragment]:
    """Fragments named by a store listing of (path, mod_time); other keys are logged
    and skipped (a store may hold unrelated files)."""
    out = []
    for path, mod_time in paths:
        try:
            out.append(Fragment.parse_path(path, store_url, mod_time))
        except ValidationError as err:
            log.warning("%s: skipping %s", store_url, err)
    return out
