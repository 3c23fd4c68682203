"""The fragment index: which fragments of a journal a broker can read from.

A broker learns fragments from its own spools (local, not yet persisted) and from store
listings (persisted). `FragmentSet` keeps one journal's fragments sorted and minimal: a
fragment whose range another already covers is dropped (a persisted one wins over a local
one of the same range), while partly overlapping fragments are all kept (they appear when
a journal's peer set changes mid-fragment). `FragmentIndex` holds the sets of every
journal and lets blocking reads wait for an offset to become readable.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections.abc import Iterable, Iterator

from gazette.errors import ValidationError
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


class FragmentIndex:
    """Every journal's `FragmentSet`, with waits for readable offsets."""

    def __init__(self) -> None:
        self._sets: dict[str, FragmentSet] = {}
        self._waiters: dict[str, list[tuple[int, asyncio.Future[None]]]] = {}

    def fragments(self, journal: str) -> FragmentSet:
        return self._sets.get(journal) or FragmentSet()

    def end_offset(self, journal: str) -> int:
        s = self._sets.get(journal)
        return s.end_offset if s else 0

    def find(self, journal: str, offset: int) -> Fragment | None:
        s = self._sets.get(journal)
        return s.find(offset) if s else None

    def add_local(self, fragment: Fragment) -> None:
        """A fragment of this broker's spool (not yet persisted)."""
        self._sets.setdefault(fragment.journal, FragmentSet()).add(fragment)
        self._wake(fragment.journal)

    def replace_persisted(self, journal: str, persisted: Iterable[Fragment]) -> None:
        """A fresh listing of the stores replaces what was known persisted; local
        fragments stay where the listing does not cover them yet."""
        fresh = FragmentSet(persisted)
        for f in self._sets.get(journal, ()):
            if not f.backing_store:
                fresh.add(f)
        self._sets[journal] = fresh
        self._wake(journal)

    def covers(self, journal: str, begin: int, end: int) -> bool:
        """Whether fragments of `journal` hold every offset of [begin, end)."""
        offset = begin
        while offset < end:
            f = self.find(journal, offset)
            if f is None or f.begin > offset:
                return False
            offset = f.end
        return True

    async def wait_changed(self, journal: str, timeout: float) -> None:
        """Return when `journal`'s fragments change (or after `timeout`)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(journal, []).append((-1, fut))
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            pass
        finally:
            fut.cancel()

    async def wait_for(self, journal: str, offset: int, timeout: float | None = None) -> None:
        """Return once content at or beyond `offset` of `journal` is in the index."""
        if self.end_offset(journal) > offset:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(journal, []).append((offset, fut))
        try:
            await asyncio.wait_for(fut, timeout)
        finally:
            fut.cancel()

    def _wake(self, journal: str) -> None:
        waiters = self._waiters.get(journal)
        if not waiters:
            return
        end = self.end_offset(journal)
        keep = []
        for offset, fut in waiters:
            if fut.done():
                continue
            if end > offset:
                fut.set_result(None)
            else:
                keep.append((offset, fut))
        self._waiters[journal] = keep


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
