"""`Player`: rebuilds a store's files in a local folder from its recovery log.

It reads the log from where the hints say the live files' operations begin, skipping
stretches that hold only files deleted since, applies each operation in sequence (file
writes in a worker thread, a read chunk at a time), and plays to the log's write head.
Then a primary `handoff`s: it appends a no-op that makes it the log's writer (its
author in the log's registers, the old one's removed, at the exact head it played to),
and records from there; a hot standby `tail`s the log to keep its copy current.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Counter

from gazette.client import AppendUncertain, BrokerError, JournalClient
from gazette.errors import GazetteError
from gazette.labels import LabelSet, Selector
from gazette.protocol.status import Status
from gazette.recoverylog.blocks import MappedFiles, apply_copy, apply_patch
from gazette.recoverylog.fsm import FSM, Hints, InconsistentOp, OutOfSequence
from gazette.recoverylog.ops import (
    CorruptLog,
    Decoder,
    Kind,
    Op,
    record,
)
from gazette.recoverylog.recorder import AUTHOR_LABEL, Recorder, fence

log = logging.getLogger(__name__)

#: Registers of a log no writer has taken (no author).
_UNTAKEN = Selector(exclude=LabelSet([(AUTHOR_LABEL, "")]))

#: Hand-off appends whose outcome was lost, at most, before `handoff` gives up.
HANDOFF_ATTEMPTS = 8

PLAYED_BYTES = Counter("gazette_recoverylog_played_bytes_total",
                       "Bytes of recovery logs read by players")
SKIPPED_OPS = Counter("gazette_recoverylog_out_of_sequence_ops_total",
                      "Recovery-log operations skipped as out of sequence (raced writers)")


class PlaybackError(GazetteError):
    """Playback cannot go on: a corrupt log, a missing fragment, hints that do not fit
    the log. Names the shard (or log) and the offset."""


@dataclass
class Progress:
    """Bytes played of bytes to play (as of the last look at the write head)."""

    played: int = 0
    to_play: int = 0


class Player:
    """Plays `log` into the folder `root` (emptied first), from `hints` (None: from the
    log's start). `name` says whose log it is in errors (the shard)."""

    def __init__(self, client: JournalClient, log_name: str, root: Path,
                 hints: Hints | None = None, name: str = "") -> None:
        self.client, self.log, self.root = client, log_name, root
        self.name = name or log_name
        self.fsm = FSM(hints)
        self.offset = min((s.first_offset for s in self.fsm.pending), default=0)
        self.progress = Progress()
        self.on_progress: Callable[[Progress], None] | None = None
        self._fds: dict[int, int] = {}  # fnode -> open file
        self._maps = MappedFiles()  # what copies and patches read and write
        self._paths: dict[int, set[Path]] = {}  # fnode -> its paths on disk
        self._prepared = False
        #: Set once the files may differ from the FSM (a write failed): no more playing.
        self._broken: PlaybackError | None = None

    def _error(self, offset: int, what: str) -> PlaybackError:
        return PlaybackError(f"{self.name}: playing recovery log {self.log} at offset "
                             f"{offset}: {what}")

    async def _prepare(self) -> None:
        if self._broken is not None:
            raise self._broken
        if not self._prepared:
            await asyncio.to_thread(_empty_folder, self.root)
            self._prepared = True

    async def play(self) -> int:
        """Play to the log's write head (as of now); returns it."""
        await self._prepare()
        try:
            head = await self.client.write_head(self.log)
        except BrokerError as err:
            if err.status is not Status.JOURNAL_NOT_FOUND:
                raise
            raise PlaybackError(f"{self.name}: its recovery log {self.log} does not "
                                "exist (create the journal)") from None
        for seg in self.fsm.pending:
            if seg.last_offset > head:
                raise self._error(seg.last_offset, f"the hints point past the log's end "
                                  f"({head})")
        self.progress.to_play = self.progress.played + max(head - self.offset, 0)
        while self.offset < head:
            pending = self.fsm.pending
            while pending and self.offset >= pending[0].last_offset:
                pending.pop(0)  # read through
            if pending and self.offset < pending[0].first_offset:
                self.fsm.skip_to(pending[0])  # only deleted files' operations before it
                self.progress.played += pending[0].first_offset - self.offset  # done
                self.offset = pending[0].first_offset
            end = pending[0].last_offset if pending else head
            await self._read(self.offset, end, block=False)
        return head

    async def tail(self, stop: asyncio.Event) -> None:
        """Keep playing what is appended, until `stop` is set (a hot standby)."""
        await self._prepare()
        stopped = asyncio.ensure_future(stop.wait())
        reading = asyncio.ensure_future(self._read(self.offset, 0, block=True))
        try:
            await asyncio.wait({stopped, reading}, return_when=asyncio.FIRST_COMPLETED)
            if reading.done():
                reading.result()
        finally:
            for task in (stopped, reading):
                task.cancel()
            await asyncio.gather(stopped, reading, return_exceptions=True)

    async def _read(self, begin: int, end: int, *, block: bool) -> None:
        decoder = Decoder(self.log, begin)
        reads = self.client.read(self.log, begin, block=block, end_offset=end)
        async with contextlib.aclosing(reads) as chunks:
            async for chunk in chunks:
                if chunk.offset != decoder.fed:
                    raise self._error(decoder.fed, f"log content is missing up to "
                                      f"{chunk.offset} (a removed fragment?)")
                try:
                    frames = decoder.feed(chunk.content)
                except CorruptLog as err:
                    raise self._error(err.offset, err.reason) from None
                effects = self._sequence(frames)
                if effects:
                    await self._applied(effects, decoder.offset)
                self.offset = decoder.offset
                PLAYED_BYTES.inc(len(chunk.content))
                self.progress.played += len(chunk.content)
                if self.on_progress is not None:
                    self.on_progress(self.progress)
        if end and decoder.offset < end:
            where = "a frame is cut off" if decoder.pending else "the log ends early"
            raise self._error(decoder.offset, f"{where} (expected content up to {end})")

    async def _applied(self, effects: list[tuple[Op, bytes, int]], offset: int) -> None:
        """Play `effects` (the FSM has taken them) in a worker thread, through `offset`.
        A cancellation waits for the thread: the files must be as the FSM says before
        anyone else touches them (a standby's hand-off), and `offset` must follow the
        FSM (else what it took would be read again, out of sequence)."""
        applying = asyncio.ensure_future(asyncio.to_thread(self._apply, effects))
        try:
            await asyncio.shield(applying)
        except asyncio.CancelledError:
            while not applying.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait({applying})
            if applying.exception() is None:
                self.offset = offset
            else:
                self._broken = self._error(offset, f"writing the files: "
                                           f"{applying.exception()}")
            raise
        except (OSError, ValueError) as err:  # (ValueError: a copy's or patch's data)
            at = getattr(err, "op_begin", offset)  # (where the failing frame starts)
            self._broken = self._error(at, f"writing the files: {err}")
            raise self._broken from None

    def _sequence(self, frames: list[tuple[Op, bytes]]) -> list[tuple[Op, bytes, int]]:
        """Run frames through the FSM; the file effects to play, with each one's fnode."""
        out = []
        for op, data in frames:
            try:
                played = self.fsm.apply(op)
            except OutOfSequence as err:
                SKIPPED_OPS.inc()
                log.info("%s: skipping %s", self.name, err)
                continue
            except InconsistentOp as err:
                raise self._error(op.begin, str(err)) from None
            if played:
                out.append((op, data, op.seq_no if op.kind is Kind.CREATE else op.fnode))
        return out

    def _apply(self, effects: list[tuple[Op, bytes, int]]) -> None:
        """File effects, in a worker thread (a failure says which frame's)."""
        for op, data, fnode in effects:
            try:
                self._apply_one(op, data, fnode)
            except (OSError, ValueError) as err:
                setattr(err, "op_begin", op.begin)  # noqa: B010 - (read in _applied)
                raise

    def _apply_one(self, op: Op, data: bytes, fnode: int) -> None:
        kind, path = op.kind, self.root / op.path if op.path else None
        if kind is Kind.CREATE:
            assert path is not None
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fds[fnode] = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            self._paths[fnode] = {path}
        elif kind is Kind.WRITE:
            os.pwrite(self._fds[fnode], data, op.offset)
        elif kind is Kind.TRUNCATE:
            self._maps.drop(fnode)  # (a map past a file's end must not be read)
            os.ftruncate(self._fds[fnode], op.length)
        elif kind is Kind.COPY:
            apply_copy(self._maps, self._fds, op.offset, fnode, data)
        elif kind is Kind.PATCH:
            apply_patch(self._maps, self._fds, fnode, op.offset, data)
        elif kind is Kind.LINK:
            assert path is not None
            path.parent.mkdir(parents=True, exist_ok=True)
            os.link(next(iter(self._paths[fnode])), path)
            self._paths[fnode].add(path)
        elif kind is Kind.UNLINK:
            assert path is not None
            os.unlink(path)
            paths = self._paths[fnode]
            paths.discard(path)
            if not paths:
                del self._paths[fnode]
                self._maps.drop(fnode)
                os.close(self._fds.pop(fnode))

    async def handoff(self, author: int) -> Recorder:
        """Make this process the log's writer: play to the head, append a no-op exactly
        there that puts `author` in the log's registers (removing any other author), and
        return the recorder that goes on from it. A no-op that would not land at the
        head played to is refused (a writer appended meanwhile, or took the empty log
        first): this plays what it wrote and tries again after it, as after an append
        whose outcome was lost (if it landed, it is played: the next no-op follows it)."""
        uncertain, refused_at = 0, -1
        while True:
            head = await self.play()
            if head == refused_at:
                raise self._error(head, "the hand-off's no-op was refused, yet nothing "
                                  "was appended (an author in the registers of an empty "
                                  "log?)")
            frame = bytearray()
            op = record(frame, Kind.NOOP, self.fsm.next_seq_no, self.fsm.next_checksum,
                        author, head)
            try:
                registers = (await self.client.append(self.log, b"")).registers
                authors = registers - registers.without(AUTHOR_LABEL)  # earlier writers'
                # The broker checks no offset 0 ("expect an empty journal" cannot be
                # said); a log no writer has taken names no author.
                result = await self.client.append(
                    self.log, frame, offset=head,
                    check_registers=_UNTAKEN if head == 0 else None,
                    union_registers=fence(author), subtract_registers=authors - fence(author))
            except BrokerError as err:
                if err.status in (Status.WRONG_APPEND_OFFSET, Status.REGISTER_MISMATCH):
                    log.info("%s: handing off recovery log %s at %d: another writer came "
                             "first (%s); playing what it wrote", self.name, self.log, head,
                             err.status)
                    refused_at = head if err.status is Status.REGISTER_MISMATCH else -1
                    continue
                raise
            except AppendUncertain as err:
                # (One at offset 0 cannot be resolved by the client: the broker checks
                # no offset there.)
                uncertain += 1
                if uncertain >= HANDOFF_ATTEMPTS:
                    raise
                log.warning("%s: handing off recovery log %s: %s; playing it again",
                            self.name, self.log, err)
                await asyncio.sleep(min(0.1 * 2 ** uncertain, 2.0))  # backoff
                continue
            if result.commit.begin != head:
                # After content never played (not a recorder's: it would name an
                # author). Out of sequence there, our no-op is skipped by every reader.
                log.warning("%s: the hand-off's no-op of recovery log %s landed at %d, "
                            "not at %d; playing it again", self.name, self.log,
                            result.commit.begin, head)
                continue
            self.fsm.apply(op)
            self.offset = result.commit.end
            await asyncio.to_thread(self._close_files)
            return Recorder(self.client, self.log, self.fsm, author, result.commit.end)

    async def finish(self) -> None:
        """Stop playing (without taking the log): close the files."""
        await asyncio.to_thread(self._close_files)

    def _close_files(self) -> None:
        self._maps.close()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._paths.clear()


def _empty_folder(root: Path) -> None:
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
