"""Reads of a replica: from its open spool, closed spools not yet persisted, or persisted
fragments (fetched into the broker's verified cache).

A read never skips content this broker knows of and never ends part-way because a
spool was persisted meanwhile: a closed spool's local file is removed only after the
index holds its persisted copy, and a read that finds the file gone reads that copy.
A *gap* this replica rolled past (content only its peers hold until they persist it:
it joined the journal's route late, say) is waited for by every read that meets it,
blocking or not, listing the stores again every second, until the content is
persisted; only a read that waited `GAP_WAIT_SECONDS` in one gap gives it up (the
content was never acknowledged and its holders are gone), skips it and says so in the
log and ``gazette_broker_read_gaps_skipped_total``. A read that may go elsewhere
(``leave_gaps``) raises `InGap` instead of waiting, so that its caller reads the gap
from the journal's primary (`gazette_broker.replica_reads`): the primary holds it, and
it is persisted only once the primary's spool rolls. Content that retention removed
(before the first fragment the stores hold) is skipped at once. A read of a journal
whose replica closes (the journal was deleted, or moved away) ends with
`JournalClosed`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator
from datetime import timedelta

from prometheus_client import Counter

from gazette.client import ReadChunk
from gazette.errors import ValidationError
from gazette.fragment import Fragment, JournalClosed, read_file
from gazette.fragment.store import StoreError
from gazette.protocol import Status
from gazette_broker.errors import StatusError
from gazette_broker.replica_state import Gap, ReplicaState

log = logging.getLogger(__name__)

READ_BYTES = Counter("gazette_broker_read_bytes_total", "Bytes served to readers")
GAPS_SKIPPED = Counter("gazette_broker_read_gaps_skipped_total",
                       "Gaps of content only peers held that a read gave up waiting for")

#: Largest chunk a read yields at once (large messages are cheaper per byte over gRPC).
READ_CHUNK = 1 << 20
#: A read waiting this long in a gap of content only peers held gives it up (that
#: content was never acknowledged, and its holders are gone) and skips it.
GAP_WAIT_SECONDS = 60.0
#: While reads wait in a gap, the stores are listed again at most this often.
GAP_REFRESH_SECONDS = 1.0


class ReadError(StatusError):
    """A read that cannot be served (yet)."""


class InGap(Exception):
    """A read (with ``leave_gaps``) met a gap: [offset, end) is held by peers only."""

    def __init__(self, offset: int, end: int) -> None:
        super().__init__(f"offsets [{offset}, {end}) are held by peers only")
        self.offset, self.end = offset, end


class ReadPart:
    """A replica's read part: reads, and the gaps they wait in or give up."""

    def __init__(self, state: ReplicaState) -> None:
        self.state = state
        self.skipped: list[tuple[int, int]] = []  # gaps reads gave up
        self.last_gap_refresh = 0.0

    def _check_open(self) -> None:
        state = self.state
        if state.closed:
            raise JournalClosed(f"{state.spec.name}: {state.closed}")

    def _locate(self, offset: int) -> tuple[int, Fragment | None, bool]:
        """Where `offset` is read from now: (offset, fragment, whether it is the open
        spool's). The offset moves forward past a hole (content removed by retention);
        the fragment is None at or beyond the write head, and in a gap (any hole that
        retention does not explain)."""
        state = self.state
        if offset == -1:
            offset = state.write_head
        if offset < 0:
            raise ValidationError("offset", f"must be -1 or >= 0, got {offset}")
        spool = state.spool
        if offset >= spool.end:
            return offset, None, False
        if offset >= spool.begin:
            return offset, spool.fragment, True
        found = state.index.find(offset)
        if found is None or found.begin > offset:  # no fragment here holds `offset`
            if self._in_gap(offset):
                return offset, None, False  # peers hold it: wait until it is persisted
            if not self._removed(offset):
                # A hole retention does not explain (this replica restarted, say, while
                # a peer's upload of it was delayed): a gap, waited for as any.
                end = found.begin if found is not None and found.begin < spool.begin \
                    else spool.begin
                log.info("%s: no fragment known here holds [%d, %d): reads wait for it to "
                         "be persisted", state.spec.name, offset, end)
                state.gaps.append(Gap(offset, end))
                return offset, None, False
        if found is None or found.begin >= spool.begin:
            # A hole reaching up to the open spool: the read goes on from there (and
            # waits there, if the spool is still empty).
            offset = spool.begin
            return (offset, spool.fragment, True) if spool.end > offset else \
                (offset, None, False)
        return max(offset, found.begin), found, False

    def _removed(self, offset: int) -> bool:
        """Whether no fragment holds `offset` because it was removed on purpose:
        retention removes a journal's oldest fragments (those before the first one the
        stores hold), or a read gave that gap up."""
        if any(begin <= offset < end for begin, end in self.skipped):
            return True
        # With no fragment left at all, the first one the stores hold is the open spool.
        state = self.state
        fragments = state.index.fragments()
        first = fragments.begin_offset if len(fragments) else state.spool.begin
        return bool(state.spec.fragment.retention) and offset < first

    def _in_gap(self, offset: int) -> bool:
        """Whether `offset` is in a gap this replica rolled past that is neither persisted
        yet nor given up on."""
        return self._gap_at(offset) is not None

    def _gap_at(self, offset: int) -> Gap | None:
        gaps = self.state.gaps
        for gap in list(gaps):
            if self.state.index.covers(gap.begin, gap.end):
                gaps.remove(gap)
            elif gap.begin <= offset < gap.end:
                return gap
        return None

    async def _wait_in_gap(self, offset: int, since: float) -> None:
        """Wait (a while) for the gap at `offset` to be persisted by the peers that hold
        it: the stores are listed again, at most every second. Once a read has waited
        `GAP_WAIT_SECONDS` (since `since`), the gap is given up."""
        gap = self._gap_at(offset)
        if gap is None:
            return
        if time.monotonic() - since > GAP_WAIT_SECONDS:
            GAPS_SKIPPED.inc()
            log.error("%s: offsets [%d, %d) were not persisted by the peers that held them "
                      "within %.0fs of a read waiting for them: skipping them (they were "
                      "never acknowledged, or their holders are gone)", self.state.spec.name,
                      gap.begin, gap.end, GAP_WAIT_SECONDS)
            self.state.gaps.remove(gap)
            self.skipped.append((gap.begin, gap.end))
            return
        if not await self._refresh_for_gap():
            await self.state.index.wait_changed(GAP_REFRESH_SECONDS)

    async def _refresh_for_gap(self) -> bool:
        """List the stores again for a read in a gap, unless that was just done;
        returns whether it was done now."""
        now = time.monotonic()
        if now - self.last_gap_refresh < GAP_REFRESH_SECONDS:
            return False
        self.last_gap_refresh = now
        try:
            await self.state.refresh()
        except StoreError as err:
            log.warning("listing %s for a read in a gap: %s", self.state.spec.name, err)
        return True

    def _check_readable(self) -> None:
        self._check_open()
        if not self.state.spec.flags.may_read:
            raise ReadError(Status.NOT_ALLOWED, f"{self.state.spec.name} is write-only (O_WRONLY)")

    async def locate(self, offset: int, *, block: bool = False) -> tuple[int, Fragment]:
        """The offset a read at `offset` starts from and the fragment holding it (for
        metadata-only reads). Without `block`, `ReadError` OFFSET_NOT_YET_AVAILABLE at
        the write head; with it, waits for the next append."""
        self._check_readable()
        since = time.monotonic()
        while True:
            offset, frag, _ = self._locate(offset)
            if frag is not None:
                return offset, frag
            if self._in_gap(offset):
                await self._wait_in_gap(offset, since)
                continue
            if not block:
                raise ReadError(Status.OFFSET_NOT_YET_AVAILABLE, f"offset {offset} is at or "
                                f"beyond the write head {self.state.write_head}")
            await self.state.index.wait_for(offset)

    def is_remote(self, fragment: Fragment) -> bool:
        """Whether `fragment` is only in a store (not in a local spool)."""
        return bool(fragment.backing_store) and \
            (fragment.begin, fragment.end) not in self.state.closed_spools

    async def sign(self, fragment: Fragment, ttl: timedelta) -> str:
        """A URL to GET `fragment`'s file from its store for `ttl` ("" if unpersisted)."""
        store_for = self.state.shared.store_for
        if not fragment.backing_store or store_for is None:
            return ""
        return await store_for(fragment.backing_store).sign(fragment, ttl)

    def fragments(self) -> list[Fragment]:
        """The journal's fragments this broker knows, in offset order (the open spool's
        last)."""
        return list(self.state.index.fragments())

    async def read(self, offset: int, *, block: bool = False, end_offset: int = 0,
                   leave_gaps: bool = False) -> AsyncGenerator[ReadChunk, None]:
        """Content from `offset` (-1: the write head) up to `end_offset` (0: no end),
        from the open spool, closed spools not yet persisted, or persisted fragments
        (fetched into a verified local cache: a corrupt one raises `CorruptFragment`).
        Without `block`, the read ends at the write head, and one that starts there
        raises `ReadError` OFFSET_NOT_YET_AVAILABLE; with it, it waits for new appends.
        Raises `JournalClosed` once the replica closes; with `leave_gaps`, `InGap` at a
        gap (unless this replica is the primary) instead of waiting there."""
        self._check_readable()
        served = False
        since = time.monotonic()  # when the read last made progress
        while not end_offset or offset < end_offset:
            self._check_open()
            offset, frag, in_spool = self._locate(offset)
            if frag is None:
                gap = self._gap_at(offset)
                if gap is not None and leave_gaps and not self.state.is_primary:
                    raise InGap(offset, gap.end)
                if gap is not None:  # blocking or not: the gap is content
                    await self._wait_in_gap(offset, since)
                    continue
                if served and not block:
                    return  # read through to the head: done
                if not block:
                    raise ReadError(Status.OFFSET_NOT_YET_AVAILABLE,
                                    f"offset {offset} is at or beyond the write head "
                                    f"{self.state.write_head}")
                await self.state.index.wait_for(offset)
                since = time.monotonic()
                continue
            limit = READ_CHUNK if not end_offset else min(READ_CHUNK, end_offset - offset)
            if in_spool:
                content = await self._read_spool(frag, offset, limit)
            else:
                content = await self._read_fragment(frag, offset, limit)
            if not content:
                continue  # the spool closed meanwhile: locate again
            READ_BYTES.inc(len(content))
            yield ReadChunk(offset, content, frag, self.state.write_head)
            offset += len(content)
            served = True
            since = time.monotonic()

    async def _read_spool(self, frag: Fragment, offset: int, size: int
                          ) -> bytes | bytearray:
        """Committed content of the open spool: from the page cache on the loop, else
        (the disk would be read) in a worker thread."""
        spool = self.state.spool
        cached = spool.read_cached(offset, size)
        if cached is not None:
            return cached
        size = min(size, spool.end - offset)
        try:
            return await asyncio.to_thread(read_file, spool.path, offset - spool.begin, size)
        except FileNotFoundError:  # closed and persisted meanwhile: read it from there
            return await self._read_fragment(frag, offset, size)

    async def _read_fragment(self, frag: Fragment, offset: int, size: int) -> bytes:
        """Content of a closed fragment: its local file while there is one, else its
        persisted copy (which the index holds before the local file goes)."""
        state = self.state
        path = state.closed_spools.get((frag.begin, frag.end))
        if path is not None:
            try:
                return await asyncio.to_thread(read_file, path, offset - frag.begin, size)
            except FileNotFoundError:
                state.closed_spools.pop((frag.begin, frag.end), None)  # persisted meanwhile
        if not frag.backing_store:
            persisted = state.index.find(offset)
            if persisted is None or not persisted.backing_store or \
                    not persisted.contains(offset):
                raise ReadError(Status.OFFSET_NOT_YET_AVAILABLE, f"fragment {frag.path} is "
                                "neither local nor persisted")
            frag = persisted
        if state.shared.store_for is None:
            raise ReadError(Status.OFFSET_NOT_YET_AVAILABLE,
                            f"fragment {frag.path} is persisted, and stores are not read here")
        store = state.shared.store_for(frag.backing_store)
        try:
            cached = await state.cache.get(store, frag)
            return await asyncio.to_thread(read_file, cached, offset - frag.begin, size)
        except FileNotFoundError:  # evicted between fetch and read: fetch again
            cached = await state.cache.get(store, frag)
            return await asyncio.to_thread(read_file, cached, offset - frag.begin, size)
