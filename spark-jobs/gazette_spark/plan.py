"""Which bytes a read covers, and how they are split into Spark partitions (driver side).

Journals and their persisted fragments are found through a broker (ListFragments, with
signed URLs) or by listing stores directly. Each journal's fragments are reduced to their
cover set (`FragmentSet`: a fragment that another covers, such as a replica's copy in a
second store, is read once) and walked from the start offset to the end offset into
`Piece`s, one per fragment. Brokers persist fragments out of order (concurrent uploads,
retries), so a range not persisted yet is no loss: a read stops before it and a stream
reads it in a later micro-batch. Such a range is one a broker lists unpersisted, or,
listing stores directly, a hole before a fragment persisted less than
``holeGraceSeconds`` ago. Any other hole inside the range is data loss: the read fails
naming it, or with ``failOnDataLoss=false`` logs it and goes on.

Pieces become `Slice`s (Spark partitions): with ``readCommitted``, all of a journal in
one slice (the Sequencer reads a journal in order); otherwise consecutive pieces of one
journal up to ``maxPartitionBytes`` each, and an uncompressed fragment of a line-based
framing larger than that is split at byte ranges (each part starts after the first
newline at or after its start: `Piece.head_cut`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path

from gazette.client import JournalClient
from gazette.errors import GazetteError
from gazette.fragment import Fragment, FragmentSet
from gazette.fragment.store import FragmentStore, store_for
from gazette.labels import journal_labels
from gazette.protocol import CompressionCodec
from gazette_spark.options import EARLIEST, LATEST, ReadOptions

log = logging.getLogger(__name__)


class DataLoss(GazetteError):
    """Bytes a read should cover are gone or unreadable (a hole, a missing or corrupt
    fragment)."""


@dataclass(frozen=True)
class Piece:
    """Bytes [begin, end) of a journal, read from `fragment` (through `url` when a broker
    signed one, else from the fragment's store)."""

    fragment: Fragment
    begin: int
    end: int
    url: str = ""
    #: A part of a split fragment that does not start at the fragment's begin: its first
    #: line belongs to the part before (it starts reading one byte early to see).
    head_cut: bool = False
    #: A part that ends inside the fragment: its last line runs on past `end`.
    tail_cut: bool = False

    @property
    def size(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class Slice:
    """One Spark partition: consecutive pieces of one journal."""

    journal: str
    pieces: tuple[Piece, ...]
    #: Read committed in a stream: where the micro-batch starts (pieces before it are
    #: read only to replay transactions pending there: -1, none are) ...
    begin: int = -1
    #: ... and each producer's Sequencer state there: (producer, last ACK clock, begin
    #: of its pending messages or -1, clock last seen), as `ProducerState` keeps them.
    states: tuple[tuple[int, int, int, int], ...] = ()

    @property
    def size(self) -> int:
        return sum(p.size for p in self.pieces)


@dataclass
class Plan:
    """What a read covers: per journal, its pieces and the offsets read [start, end)."""

    pieces: dict[str, list[Piece]] = field(default_factory=dict)
    ends: dict[str, int] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)

    @property
    def fragments(self) -> int:
        return sum(len(p) for p in self.pieces.values())

    @property
    def size(self) -> int:
        return sum(p.size for ps in self.pieces.values() for p in ps)


#: Per journal, its fragments and the URL to fetch each from ("": its store). A fragment
#: without a backing store is one a broker listed as not persisted yet.
Found = dict[str, list[tuple[Fragment, str]]]


def persisted(found: Found) -> Found:
    """`found` without the fragments a broker listed as not persisted yet."""
    return {j: [(f, url) for f, url in items if f.backing_store] for j, items in found.items()}


def open_store(url: str) -> FragmentStore:
    """A store of a ``stores=`` URL: ``file:///abs/path/`` is that folder of this machine
    (not under a broker's file root), ``s3://`` as brokers open it (credentials and
    endpoint from the environment or the URL)."""
    return store_for(url, file_root=Path("/"))


# -- discovery -------------------------------------------------------------------------


async def discover(opts: ReadOptions) -> Found:
    """Per selected journal, its fragments: persisted ones (with signed URLs from a
    broker), and through a broker those not persisted yet (`persisted` leaves them out)."""
    if opts.broker:
        return await _from_broker(opts)
    return await _from_stores(opts)


async def _from_broker(opts: ReadOptions) -> Found:
    out: Found = {}
    async with JournalClient(opts.broker) as client:
        listing = await client.list(opts.selector)
        for listed in listing.journals:
            name = listed.spec.name
            infos = await client.list_fragments(
                name, begin_mod_time=opts.start_time, end_mod_time=opts.end_time,
                signature_ttl=timedelta(seconds=opts.signature_ttl))
            out[name] = [(i.fragment, i.signed_url) for i in infos]
            waiting = sum(i.fragment.size for i in infos if not i.fragment.backing_store)
            if waiting:
                log.info("%s: %d bytes are not persisted yet and are not read (a fragment "
                         "is read once its broker persists it to a store)", name, waiting)
    return out


def _prefix_of(opts: ReadOptions) -> str:
    """The longest store prefix the selector allows listing under (one ``prefix=``)."""
    prefixes = [lb.value for lb in opts.selector.include if lb.name == "prefix"]
    names = [lb.value for lb in opts.selector.include if lb.name == "name"]
    if len(names) == 1:
        return names[0] + "/"
    return prefixes[0] if len(prefixes) == 1 else ""


async def _from_stores(opts: ReadOptions) -> Found:
    out: Found = defaultdict(list)
    prefix = _prefix_of(opts)
    for url in opts.stores:
        store = open_store(url)
        try:
            listed = await asyncio.wait_for(store.list_under(prefix), 600)
        finally:
            await store.close()
        for f in listed:
            if opts.start_time and f.mod_time < opts.start_time:
                continue
            if opts.end_time and f.mod_time >= opts.end_time:
                continue
            if opts.selector.matches(journal_labels(f.journal)):
                out[f.journal].append((f, ""))
    return dict(out)


# -- planning --------------------------------------------------------------------------


def plan(found: Found, opts: ReadOptions,
         starts: dict[str, int] | None = None) -> Plan:
    """The pieces to read of each journal; `starts` (a stream's offsets) overrides
    ``startingOffsets`` and ``startingTimestamp``."""
    out = Plan()
    now = time.time()
    for journal in sorted(found):
        urls = {f: url for f, url in found[journal]}
        frags = FragmentSet(sorted((f for f, _ in found[journal] if f.backing_store),
                                   key=lambda f: (f.begin, -f.end, f.backing_store)))
        unpersisted = [(f.begin, f.end) for f, _ in found[journal] if not f.backing_store]
        if not len(frags):
            continue
        first, last = frags.begin_offset, frags.end_offset
        first = min([first, *(b for b, _ in unpersisted)])
        want_start: str | int = (starts[journal] if starts and journal in starts
                                 else opts.starting.of(journal))
        want_end = opts.ending.of(journal)
        start = first if want_start == EARLIEST else last if want_start == LATEST else int(
            want_start)
        if opts.starting_timestamp_ms and not (starts and journal in starts):
            since = opts.starting_timestamp_ms / 1000  # (the first fragment modified since)
            start = min((f.begin for f, _ in found[journal]
                         if f.backing_store and f.mod_time >= since), default=last)
        end = last if want_end == LATEST else min(int(want_end), last)
        if start < first and want_start != EARLIEST:
            _lost(opts, journal, start, first, "before the journal's first fragment "
                  "(removed by retention?)")
        out.starts[journal], out.ends[journal] = start, max(start, end)
        pieces: list[Piece] = []
        offset = max(start, first)
        while offset < end:
            f = frags.find(offset)
            if (f is None or f.begin > offset) and _pending(offset, f, unpersisted, opts,
                                                            now):
                log.info("%s: [%d, %d) is not persisted yet: read up to %d now, the rest "
                         "once it is", journal, offset, f.begin if f else end, offset)
                end = offset
                break
            if f is None:
                break
            if f.begin > offset:
                _lost(opts, journal, offset, f.begin, "a hole between fragments")
                offset = f.begin
                if offset >= end:
                    break
            stop = min(f.end, end)
            pieces.append(Piece(f, offset, stop, urls.get(f, "")))
            offset = stop
        out.ends[journal] = max(start, end)
        out.pieces[journal] = pieces
    return out


def _pending(offset: int, following: Fragment | None, unpersisted: list[tuple[int, int]],
             opts: ReadOptions, now: float) -> bool:
    """Whether the bytes missing at `offset` (up to `following`, the next persisted
    fragment) may still be persisted: a broker listed them unpersisted, or, listing
    stores, the next fragment is younger than ``holeGraceSeconds``."""
    if any(begin <= offset < end for begin, end in unpersisted):
        return True
    return bool(opts.stores) and following is not None and \
        now - following.mod_time < opts.hole_grace_seconds


def _lost(opts: ReadOptions, journal: str, begin: int, end: int, what: str) -> None:
    message = f"{journal}: bytes [{begin}, {end}) are missing: {what}"
    if opts.fail_on_data_loss:
        raise DataLoss(message + " (failOnDataLoss=false skips them)")
    log.warning("%s; skipped (failOnDataLoss=false)", message)


def slices(the_plan: Plan, opts: ReadOptions) -> list[Slice]:
    """The Spark partitions of a plan."""
    if opts.read_committed:
        return [Slice(j, tuple(ps)) for j, ps in the_plan.pieces.items() if ps]
    target = opts.max_partition_bytes
    total = the_plan.size
    if opts.min_partitions and total:
        target = max(1, min(target, math.ceil(total / opts.min_partitions)))
    splittable = opts.framing in ("lines", "json")
    out: list[Slice] = []
    for journal, pieces in the_plan.pieces.items():
        current: list[Piece] = []
        size = 0
        for piece in pieces:
            for part in _split(piece, target) if splittable else [piece]:
                if current and (size + part.size > target or part.head_cut):
                    out.append(Slice(journal, tuple(current)))
                    current, size = [], 0
                current.append(part)
                size += part.size
                if part.tail_cut:
                    out.append(Slice(journal, tuple(current)))
                    current, size = [], 0
        if current:
            out.append(Slice(journal, tuple(current)))
    return out


def _split(piece: Piece, target: int) -> list[Piece]:
    """Parts of an uncompressed piece read from its store (not a signed URL, which is
    read whole to check its SHA-1), each about `target` bytes."""
    f = piece.fragment
    if piece.size <= target or f.codec != CompressionCodec.NONE or piece.url:
        return [piece]
    n = math.ceil(piece.size / target)
    step = math.ceil(piece.size / n)
    cuts = [piece.begin + i * step for i in range(n)] + [piece.end]
    return [replace(piece, begin=a, end=b, head_cut=a > piece.begin or piece.head_cut,
                    tail_cut=b < piece.end or piece.tail_cut)
            for a, b in itertools.pairwise(cuts)]


def admitted(the_plan: Plan, starts: dict[str, int], budget: int) -> dict[str, int]:
    """Where a micro-batch of about `budget` bytes ends in each journal of `the_plan`:
    whole pieces (fragments: a batch never ends inside one, where a line may run on),
    taken a piece per journal in turn while they fit, and at least one in all."""
    queues = {j: list(ps) for j, ps in the_plan.pieces.items() if ps}
    ends = {j: starts.get(j, the_plan.starts.get(j, 0)) for j in the_plan.pieces}
    used = 0
    while queues:
        for journal in list(queues):
            piece = queues[journal][0]
            if used and used + piece.size > budget:
                return ends
            used += piece.size
            ends[journal] = piece.end
            queues[journal].pop(0)
            if not queues[journal]:
                del queues[journal]
    return ends
