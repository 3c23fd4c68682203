"""Reading a slice on an executor: fragment content, decoded, as Arrow record batches.

Spark calls a data source's ``read`` synchronously in a Python worker; the store and
fetch code of `gazette` is asyncio, so each worker process runs it on one private event
loop (`_iterate`). A whole fragment is fetched with `fetch_fragment`, which checks its
SHA-1 and length before yielding anything, so a corrupt fragment fails (or, with
``failOnDataLoss=false``, is skipped) before any of its rows are produced. Parts of a
split fragment are byte ranges of an uncompressed file, not checked (the ``audit`` job
checks every fragment whole).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gazette.client import fetch_fragment
from gazette.fragment import CodecError, CorruptFragment
from gazette.fragment.store import FileStore, FragmentStore, StoreError
from gazette.message import ProducerState
from gazette_spark.committed import CommittedReader
from gazette_spark.decode import Block, Decoder, decoder_for
from gazette_spark.options import ReadOptions
from gazette_spark.plan import DataLoss, Piece, Slice, open_store
from gazette_spark.uuids import parse_text_column

log = logging.getLogger("gazette_spark")

T = TypeVar("T")
_loop: asyncio.AbstractEventLoop | None = None
_stores: dict[str, FragmentStore] = {}
#: Seconds between progress lines of a slice that takes long.
PROGRESS_INTERVAL = 10.0


def _iterate(agen: AsyncIterator[T]) -> Iterator[T]:
    """A sync iterator over an async one, on this process's private loop."""
    global _loop
    if _loop is None or _loop.is_closed():
        _loop = asyncio.new_event_loop()
    loop = _loop
    try:
        while True:
            try:
                yield loop.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                return
    finally:
        aclose = getattr(agen, "aclose", None)
        if aclose is not None:
            loop.run_until_complete(aclose())


def worker_logging() -> None:
    """Spark's Python workers configure no logging: give ours a stderr handler at INFO
    once, so each task's lines reach the executor's log (the console in local mode)."""
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def _store(url: str) -> FragmentStore:
    store = _stores.get(url)
    if store is None:
        store = _stores[url] = open_store(url)
    return store


async def _whole(piece: Piece) -> AsyncIterator[bytes]:
    """The piece's content from its fragment, verified whole before it is yielded."""
    f = piece.fragment
    url = piece.url
    if not url:
        store = _store(f.backing_store)
        if isinstance(store, FileStore):
            url = Path(store.path_of(f)).as_uri()
        else:
            url = await store.sign(f, timedelta(hours=1))
    pos = piece.begin
    async with contextlib.aclosing(fetch_fragment(url, f, piece.begin)) as chunks:
        async for chunk in chunks:
            if pos + len(chunk) >= piece.end:
                yield chunk[:piece.end - pos]
                return
            pos += len(chunk)
            yield chunk


async def _split_part(piece: Piece) -> AsyncIterator[tuple[int, bytes]]:
    """(offset, bytes) of the lines a part of a split (uncompressed) fragment owns: those
    that start in [begin, end) (see `plan`): from after the first newline at or after
    begin - 1 (if a part precedes it) through the first newline at or after end - 1."""
    f = piece.fragment
    store = _store(f.backing_store)
    read_from = piece.begin - 1 if piece.head_cut else piece.begin
    pos = read_from
    skipping = piece.head_cut
    raw = store.get(f, read_from - f.begin, f.end - f.begin)
    async with contextlib.aclosing(raw):  # type: ignore[type-var]
        async for chunk in raw:
            start = 0
            if skipping:
                nl = chunk.find(b"\n")
                if nl < 0:
                    pos += len(chunk)
                    continue
                start, skipping = nl + 1, False
                if pos + start >= piece.end:
                    return  # the line running over `begin` also runs over `end`: none is ours
            stop = len(chunk)
            last = piece.end - 1  # the line running over `end` ends at its newline
            if piece.tail_cut and pos + stop > last:
                nl = chunk.find(b"\n", max(start, last - pos))
                if nl >= 0:
                    yield pos + start, chunk[start:nl + 1]
                    return
            elif not piece.tail_cut and pos + stop >= piece.end:
                yield pos + start, chunk[start:piece.end - pos]
                return
            if start < stop:
                yield pos + start, chunk[start:stop]
            pos += len(chunk)


def piece_content(piece: Piece) -> Iterator[tuple[int, bytes]]:
    """(offset, bytes) of a piece, in order; raises one of `DATA_LOSS_ERRORS` when its
    fragment is missing or bad (before yielding anything, for a whole fragment)."""
    if piece.head_cut or piece.tail_cut:
        yield from _iterate(_split_part(piece))
        return
    pos = piece.begin
    for chunk in _iterate(_whole(piece)):
        yield pos, chunk
        pos += len(chunk)


#: What reading a fragment raises when its bytes are missing or bad.
DATA_LOSS_ERRORS = (CorruptFragment, CodecError, StoreError, OSError)


class SliceReader:
    """Reads one slice into record batches of `schema`."""

    def __init__(self, the_slice: Slice, opts: ReadOptions, schema: pa.Schema) -> None:
        self.slice, self.opts, self.schema = the_slice, opts, schema
        self.journal = the_slice.journal
        data = schema.field("data").type if "data" in schema.names else None
        self._data_type = data
        self.rows = self.bytes = self.fragments = 0
        self._started = self._logged = time.monotonic()

    def decoder(self) -> Decoder:
        return decoder_for(self.journal, self.opts.framing, self.opts.message_type,
                           self._data_type)

    def blocks(self, pieces: tuple[Piece, ...], begin: int = 0,
               end: int = 1 << 63) -> Iterator[Block]:
        """Decoded blocks of the pieces (only the bytes in [begin, end))."""
        decoder = self.decoder()
        last_end = -1
        for piece in pieces:
            if piece.end <= begin or piece.begin >= end:
                continue
            if last_end >= 0 and piece.begin != last_end:
                yield from decoder.finish()  # a hole, or a skipped piece
            try:
                for offset, chunk in piece_content(piece):
                    if offset + len(chunk) <= begin:
                        continue
                    if offset < begin:
                        chunk, offset = chunk[begin - offset:], begin
                    if offset >= end:
                        break
                    if offset + len(chunk) > end:
                        chunk = chunk[:end - offset]
                    self.bytes += len(chunk)
                    yield from decoder.feed(chunk, offset)
            except DATA_LOSS_ERRORS as err:
                self._lost(piece, err)
                yield from decoder.finish()
                last_end = -1
                continue
            self.fragments += 1
            self._progress()
            last_end = piece.end
        yield from decoder.finish()
        if decoder.bad_frames:
            log.warning("%s: skipped %d undecodable frames", self.journal,
                        decoder.bad_frames)

    def _progress(self) -> None:
        """A line every `PROGRESS_INTERVAL` seconds while a long slice is read."""
        now = time.monotonic()
        if now - self._logged < PROGRESS_INTERVAL:
            return
        self._logged = now
        log.info("gazette: %s: %d/%d fragments, %.1f MiB, %d rows (%.0fs)", self.journal,
                 self.fragments, len(self.slice.pieces), self.bytes / (1 << 20), self.rows,
                 now - self._started)

    def _lost(self, piece: Piece, err: BaseException) -> None:
        f = piece.fragment
        where = f"{f.backing_store}{f.path}" if f.backing_store else f.path
        message = f"{self.journal}: fragment {where} [{piece.begin}, {piece.end}) " \
                  f"cannot be read: {err}"
        if self.opts.fail_on_data_loss:
            raise DataLoss(message + " (failOnDataLoss=false skips it)") from err
        log.warning("%s; skipped (failOnDataLoss=false)", message)

    def batches(self) -> Iterator[pa.RecordBatch]:
        worker_logging()
        started = self._started = self._logged = time.monotonic()
        if self.opts.read_committed:
            yield from self._committed()
        else:
            for block in self.blocks(self.slice.pieces):
                self.rows += len(block)
                yield self.to_batch(block)
        pieces = self.slice.pieces
        log.info("gazette: %s [%d, %d): %d fragments, %.1f MiB, %d rows in %.1fs",
                 self.journal, pieces[0].begin, pieces[-1].end, self.fragments,
                 self.bytes / (1 << 20), self.rows, time.monotonic() - started)

    def _committed_reader(self) -> CommittedReader:
        def replay(begin: int, end: int) -> Iterator[Block]:
            again = SliceReader(self.slice, self.opts, self.schema)
            return again.blocks(self.slice.pieces, begin, end)

        states = [ProducerState(self.journal, *st) for st in self.slice.states]
        return CommittedReader(self.journal, replay, states)

    def _new_blocks(self) -> Iterator[Block]:
        """The blocks of the slice from its `begin` (a stream's pieces before it are
        there only to be replayed)."""
        return self.blocks(self.slice.pieces, max(self.slice.begin, 0))

    def sequenced(self) -> list[tuple[int, int, int, int]]:
        """Each producer's Sequencer state at the slice's end, read committed (on a
        stream's driver: what the micro-batch's offset keeps for the next)."""
        reader = self._committed_reader()
        for block in self._new_blocks():
            reader.feed(block)
        return [(st.producer, st.last_ack, st.begin, st.last_seen)
                for st in reader.states()]

    def _committed(self) -> Iterator[pa.RecordBatch]:
        reader = self._committed_reader()
        for block in self._new_blocks():
            out = reader.feed(block)
            if isinstance(out, np.ndarray):
                kept = int(out.sum())
                if kept:
                    self.rows += kept
                    batch = self.to_batch(block)
                    yield batch if kept == len(block) else batch.filter(pa.array(out))
            elif out:
                self.rows += len(out)
                yield self.rows_to_batch(out)

    def to_batch(self, block: Block) -> pa.RecordBatch:
        n = len(block)
        cols: list[Any] = []
        uu = block.uuids
        for name in self.schema.names:
            if name == "journal":
                cols.append(pa.repeat(pa.scalar(self.journal), n))
            elif name == "offset":
                cols.append(pa.array(block.begins, pa.int64()))
            elif name == "value":
                cols.append(block.values)
            elif name == "data":
                cols.append(block.data)
            elif uu is None:
                cols.append(pa.nulls(n, self.schema.field(name).type))
            elif name == "uuid":
                cols.append(_where(uu.has, block.uuid_text))
            elif name == "producer":
                cols.append(_where(uu.has, pc.utf8_lower(
                    pc.utf8_slice_codeunits(block.uuid_text, 24, 36))))
            elif name == "clock":
                cols.append(pa.array(uu.clock.astype(np.int64), mask=~uu.has))
            elif name == "flags":
                cols.append(pa.array(uu.flags.astype(np.int32), mask=~uu.has))
        return pa.RecordBatch.from_arrays(cols, schema=self.schema)

    def rows_to_batch(self, rows: list[dict[str, Any]]) -> pa.RecordBatch:
        texts = pa.array([r["uuid"] for r in rows], pa.string())
        block = Block(np.array([r["offset"] for r in rows], dtype=np.int64),
                      np.zeros(len(rows), dtype=np.int64),
                      pa.array([r["value"] for r in rows],
                               self.schema.field("value").type), texts,
                      parse_text_column(texts),
                      pa.array([r["data"] for r in rows], self._data_type)
                      if self._data_type is not None else None)
        return self.to_batch(block)


def _where(has: np.ndarray, texts: pa.Array) -> pa.Array:
    """`texts` where `has`, else null (as is, when every row has one)."""
    if has.all():
        return texts
    return pc.if_else(pa.array(has), texts, pa.scalar(None, pa.string()))
