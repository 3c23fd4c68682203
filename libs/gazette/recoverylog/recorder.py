"""`Recorder`: a store's file operations, sequenced into its recovery log.

Operations are recorded as they happen (after the store made them on its local
files) and buffered; `commit()` appends everything since the last commit as one append,
which lands whole or not at all. Each append must land at the write head this recorder
expects and only while the log's `author` register names it: once a successor has taken
the log (`Player.handoff`), the old primary's appends are refused (REGISTER_MISMATCH or
WRONG_APPEND_OFFSET), so a zombie can neither corrupt the log nor commit. A store's
commit is durable only once `commit()` returns.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import os
import threading
from collections.abc import Callable

from prometheus_client import Counter

from gazette.client import JournalClient
from gazette.errors import GazetteError
from gazette.labels import LabelSet, Selector
from gazette.protocol.status import Status
from gazette.recoverylog.fsm import FSM, Hints
from gazette.recoverylog.ops import (
    HEADER_SIZE,
    Block,
    Kind,
    Op,
    chain,
    copy_data,
    packed_patch,
    patch_data,
    patch_sources,
    record,
    record_in_place,
)
from gazette.supervise import retrieved

log = logging.getLogger(__name__)

#: The journal register that names the recorder a recovery log belongs to.
AUTHOR_LABEL = "author"

RECORDED_BYTES = Counter("gazette_recoverylog_recorded_bytes_total",
                         "Bytes of file operations appended to recovery logs")
RECORDED_OPS = Counter("gazette_recoverylog_recorded_ops_total",
                       "File operations appended to recovery logs")

#: The most bytes one write operation grows to by extension.
MAX_MERGED_WRITE = 4 << 20
#: Blocks one copy operation names, at most (16 bytes each).
MAX_COPY_PAIRS = 1 << 20
#: Appends of sealed commits under way at once (more wait, and go merged). One:
#: fewer, larger appends cost the event loop and the broker less than several under
#: way (measured with a SQLite store's 16 commits in flight), and none waits at the
#: broker for the one before it.
APPENDS_IN_FLIGHT = 1
#: The most bytes of sealed commits merged into one append.
MAX_MERGED_APPEND = 16 << 20


class RecorderFenced(GazetteError):
    """The log was taken over (or an append failed): this recorder writes no more."""


def fence(author: int) -> LabelSet:
    return LabelSet([(AUTHOR_LABEL, f"{author:08x}")])


class Sealed:
    """A commit taken from the recorder (`Recorder.seal`): its frames, where they land,
    and the hints of the log as it leaves it."""

    __slots__ = ("data", "hints", "landed", "offset", "ops", "ready", "tail", "want_hints")

    def __init__(self, data: bytearray, ops: int, offset: int, hints: Hints | None
                 ) -> None:
        self.data, self.ops, self.offset, self.hints = data, ops, offset, hints
        self.ready = False  # `land` was called: it may be sent
        #: Its last frame, still being encoded (`Recorder.patch_later`): it is added
        #: (and the hints taken, if wanted) once done.
        self.tail: concurrent.futures.Future[_Encoded] | None = None
        self.want_hints = False
        self.landed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.landed.add_done_callback(retrieved)  # (failed alike)


#: Frames encoded in the recorder's thread: their bytes, their ops, and a callback
#: told the bytes of their data once they are taken in.
_Encoded = tuple[bytearray, list[Op], Callable[[int], None] | None]
#: An operation to encode there: kind (WRITE or PATCH), fnode, offset, its bytes (a
#: patch's XORed bytes, or with blocks None its parts laid out: `ops.packed_patch`),
#: and a patch's packed blocks and sources (None, empty for a write).
Later = tuple[Kind, int, int, bytes | memoryview, bytes | None, set[int]]


def _joined(buf: bytearray, more: bytearray) -> bytearray:
    """`buf` extended by `more` (`more` itself when `buf` is empty: most often, no copy)."""
    if not buf:
        return more
    buf += more
    return buf


class Recorder:
    """Records into `log` after `fsm` (as played, or after the handoff that made this
    process the log's writer, whose end is `head`). Paths are relative to the store's
    folder."""

    def __init__(self, client: JournalClient, log_name: str, fsm: FSM, author: int,
                 head: int) -> None:
        self.client, self.log, self.fsm, self.author = client, log_name, fsm, author
        self.head = head  # the write head: where the next commit lands
        self._pending = bytearray()  # recorded, not yet being committed
        self._ops = 0
        self._inflight = 0  # bytes of sealed commits under way (they land at `head`)
        self._unsent: collections.deque[Sealed] = collections.deque()  # sealed, in order
        self.appends_in_flight = APPENDS_IN_FLIGHT
        self._sends: set[asyncio.Future[None]] = set()  # appends under way
        self._last_send: asyncio.Future[None] | None = None  # the last one's outcome
        #: The last frame, still being encoded in `_encoder`'s thread, and the sealed
        #: commit it ends if it was sealed meanwhile.
        self._encoder: concurrent.futures.ThreadPoolExecutor | None = None
        self._encoding: concurrent.futures.Future[_Encoded] | None = None
        self._encoding_sealed: Sealed | None = None
        #: Held while recording and while a commit takes the buffer: a store's engine
        #: may record from a worker thread.
        self.lock = threading.RLock()
        self._check = Selector(include=fence(author))
        self.failed: BaseException | None = None
        self._detached = False
        #: A write not yet framed, which the next write may continue: (fnode, offset,
        #: data).
        self._open: tuple[int, int, bytes | bytearray] | None = None

    # -- recording (synchronous: after the local operation succeeded) --

    def _check_recording(self) -> bool:
        """Whether to record (not after `detach`); raises once the recorder failed."""
        if self._detached:
            return False
        if self.failed is not None:
            raise RecorderFenced(f"recovery log {self.log}: no longer recording "
                                 f"({self.failed})")
        return True

    def _record(self, kind: Kind, *, fnode: int = 0, offset: int = 0, length: int = 0,
                path: str = "", data: bytes | bytearray | memoryview = b"") -> int:
        if not self._check_recording():
            return 0
        with self.lock:
            self._close_write()
            return self._frame(kind, fnode=fnode, offset=offset, length=length, path=path,
                               data=data)

    def _close_write(self) -> None:
        """Frame the write being extended, if any (under `lock`)."""
        if self._open is not None:
            fnode, offset, data = self._open
            self._open = None
            self._frame(Kind.WRITE, fnode=fnode, offset=offset, length=len(data), data=data)

    def _frame(self, kind: Kind, *, fnode: int = 0, offset: int = 0, length: int = 0,
               path: str = "", data: bytes | bytearray | memoryview = b"") -> int:
        fsm = self.fsm
        with self.lock:
            self._settle()
            seq_no = fsm.next_seq_no
            # The frame lands here (after a commit under way): commits append at the
            # expected head, in order, or fail.
            op = record(self._pending, kind, seq_no, fsm.next_checksum, self.author,
                        self.head + self._inflight + len(self._pending), fnode=fnode,
                        offset=offset, length=length, path=path, data=data)
            fsm.apply(op)
            self._ops += 1
        return seq_no

    def create(self, path: str) -> int:
        """A new, empty file at `path` (which must be free); returns its fnode."""
        return self._record(Kind.CREATE, path=path)

    def write(self, fnode: int, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Bytes written at `offset`. A write that continues the one before it (SQLite's
        WAL frame header, then its page) extends it: one operation, not two."""
        if not self._check_recording():
            return
        with self.lock:
            open_ = self._open
            if open_ is not None and open_[0] == fnode and \
                    open_[1] + len(open_[2]) == offset and \
                    len(open_[2]) + len(data) <= MAX_MERGED_WRITE:
                buf = open_[2]
                if not isinstance(buf, bytearray):
                    buf = bytearray(buf)
                    self._open = (fnode, open_[1], buf)
                buf += data
                return
            self._close_write()
            # A caller's buffer may change after this returns: bytes are kept as they are.
            self._open = (fnode, offset, data if isinstance(data, bytes) else bytes(data))

    def write_from(self, fnode: int, offset: int, fd: int, length: int,
                   look: Callable[[memoryview], None] | None = None) -> None:
        """`length` bytes written at `offset`, which the local file `fd` holds there:
        read straight into their frame (the kernel's copy is the only one). `look` is
        shown them first (they are not kept apart: it must not keep the view)."""
        if not self._check_recording() or not length:
            return
        with self.lock:
            self._close_write()
            self._settle()
            frame = bytearray(HEADER_SIZE + length)
            with memoryview(frame) as view:
                read = os.preadv(fd, [view[HEADER_SIZE:]], offset)
                if read != length:
                    raise OSError(f"recovery log {self.log}: fnode {fnode} holds "
                                  f"{read} bytes at {offset}, not {length}")
                if look is not None:
                    with view[HEADER_SIZE:] as data:
                        look(data)
                fsm = self.fsm
                op = record_in_place(view, Kind.WRITE, fsm.next_seq_no,
                                     fsm.next_checksum, self.author,
                                     self.head + self._inflight + len(self._pending),
                                     fnode=fnode, offset=offset)
            fsm.apply(op)
            self._ops += 1
            self._pending = _joined(self._pending, frame)

    def copy(self, src: int, dst: int, block: int,
             pairs: list[tuple[int, int]] | bytes) -> None:
        """Blocks of `block` bytes copied from `src` into `dst`, each (source offset,
        offset), or those packed (`ops.copy_data`): what a store records instead of
        bytes it moved between its files."""
        step = MAX_COPY_PAIRS * (16 if isinstance(pairs, bytes) else 1)
        for at in range(0, len(pairs), step):
            data = copy_data(block, pairs[at:at + step])
            self._record(Kind.COPY, fnode=dst, offset=src, length=len(data), data=data)

    def patch(self, fnode: int, offset: int, blocks: list[Block] | bytes,
              xored: bytes | bytearray | memoryview, sources: set[int] | None = None
              ) -> int:
        """Bytes written at `offset`, given as `blocks` (source fnode, source offset,
        length: 0 for zeros; or packed, with the `sources` they read) XORed with
        `xored`: a stretch that mostly repeats bytes the files hold already records
        little once compressed. Returns the bytes its data takes."""
        data = patch_data(blocks, xored)
        path = patch_sources(blocks) if isinstance(blocks, list) else \
            patch_sources(sources=sources)
        self._record(Kind.PATCH, fnode=fnode, offset=offset, length=len(data), path=path,
                     data=data)
        return len(data)

    def write_compressed(self, fnode: int, offset: int, data: bytes) -> None:
        """Bytes written at `offset`, given compressed by the caller (`ops.compressed`,
        in a worker thread, say): recorded as a `PATCH` that reads no file."""
        self._record(Kind.PATCH, fnode=fnode, offset=offset, length=len(data), data=data)

    def record_later(self, make: Callable[[], list[Later]],
                     recorded: Callable[[int], None] | None = None) -> None:
        """Operations (`WRITE` or `PATCH`: kind, fnode, offset, data, and for a patch
        its blocks packed and its sources) that `make` computes in the recorder's own
        thread, encoded there too, while the caller goes on: the next operation
        recorded, or a commit's landing, waits for them. `make` must read only what
        stays as it is until then. `recorded` is told the bytes their data took."""
        if not self._check_recording():
            return
        with self.lock:
            self._close_write()
            self._settle()
            fsm, author = self.fsm, self.author
            seq_no, checksum = fsm.next_seq_no, fsm.next_checksum
            begin = self.head + self._inflight + len(self._pending)

            def encode() -> _Encoded:
                frames, ops, at, seq, sum_ = bytearray(), [], begin, seq_no, checksum
                for kind, fnode, offset, payload, blocks, sources in make():
                    data: bytes | memoryview = payload
                    path = ""
                    if kind is Kind.PATCH:
                        data = packed_patch(payload) if blocks is None else \
                            patch_data(blocks, payload)
                        path = patch_sources(sources=sources)
                    op = record(frames, kind, seq, sum_, author, at, fnode=fnode,
                                offset=offset, length=len(data), path=path, data=data)
                    ops.append(op)
                    at, seq, sum_ = op.end, seq + 1, chain(sum_, op.crc)
                return frames, ops, recorded

            if self._encoder is None:
                self._encoder = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix=f"encode:{self.log}")
            self._encoding = self._encoder.submit(encode)
            self._encoding_sealed = None

    def _settle(self) -> None:
        """Take in the frames being encoded, if any (under `lock`): into what is
        pending, or the commit sealed with them."""
        fut = self._encoding
        if fut is None:
            return
        self._encoding = None
        try:
            frame, ops, recorded = fut.result()
        except BaseException as err:
            self.failed = self.failed or err
            raise RecorderFenced(f"recovery log {self.log}: encoding a frame failed: "
                                 f"{err}") from err
        for op in ops:
            self.fsm.apply(op)
        sealed, self._encoding_sealed = self._encoding_sealed, None
        if sealed is None:
            self._pending = _joined(self._pending, frame)
            self._ops += len(ops)
        else:
            sealed.data = _joined(sealed.data, frame)
            sealed.ops += len(ops)
            self._inflight += len(frame)
            if sealed.want_hints:
                sealed.hints = self.fsm.hints(self.log)
        if recorded is not None:
            recorded(sum(op.length for op in ops))

    def settle(self) -> None:
        """Wait for the frame being encoded (what it reads may change from here)."""
        with self.lock:
            self._settle()

    def truncate(self, fnode: int, size: int) -> None:
        self._record(Kind.TRUNCATE, fnode=fnode, length=size)

    def link(self, fnode: int, path: str) -> None:
        self._record(Kind.LINK, fnode=fnode, path=path)

    def unlink(self, path: str) -> None:
        fnode = self.fsm.links.get(path)
        if fnode is None:
            raise FileNotFoundError(f"recovery log {self.log}: no recorded file {path!r}")
        self._record(Kind.UNLINK, fnode=fnode, path=path)

    def rename(self, src: str, dst: str) -> None:
        """`src` takes the place of `dst` (replacing a file there)."""
        with self.lock:
            fnode = self.fsm.links.get(src)
            if fnode is None:
                raise FileNotFoundError(f"recovery log {self.log}: no recorded file "
                                        f"{src!r}")
            if dst in self.fsm.links:
                self.unlink(dst)
            self.link(fnode, dst)
            self.unlink(src)

    def detach(self) -> None:
        """Record nothing more (changes from now on are dropped, commits fail): the
        store closes, and its folder is played afresh from the log next time."""
        self._detached = True
        self.failed = self.failed or RecorderFenced(f"recovery log {self.log}: the "
                                                    "recorder was detached")
        if self._encoder is not None:
            self._encoder.shutdown(wait=False, cancel_futures=True)

    def fnode(self, path: str) -> int | None:
        return self.fsm.links.get(path)

    @property
    def encoding(self) -> bool:
        """Whether frames are being encoded (`settle` would wait for them)."""
        return self._encoding is not None and not self._encoding.done()

    @property
    def pending_bytes(self) -> int:
        return len(self._pending) + (len(self._open[2]) if self._open is not None else 0)

    # -- committing --

    def seal(self, *, hints: bool = False) -> Sealed:
        """Take what was recorded so far as the next commit (what is recorded from now
        on goes after it). Sealing is synchronous, so a store seals exactly its
        transaction's operations at its commit; `land` appends them later. Several
        sealed commits may be under way: they land in the order they were sealed (up
        to `appends_in_flight` appends at once, at the offsets they expect; sealed
        commits ready meanwhile go together as one append). With `hints`, the sealed
        commit carries the hints of the log as it leaves it."""
        with self.lock:
            self._raise_failed()
            self._close_write()
            if self._encoding_sealed is not None:  # the last seal's frame: take it in
                self._settle()
            data, ops = self._pending, self._ops
            self._pending, self._ops = bytearray(), 0
            encoding = self._encoding
            sealed = Sealed(data, ops, self.head + self._inflight,
                            self.fsm.hints(self.log) if hints and encoding is None
                            else None)
            self._inflight += len(data)
            if encoding is not None:  # its last frame: added once encoded
                sealed.tail, sealed.want_hints = encoding, hints
                self._encoding_sealed = sealed
            self._unsent.append(sealed)
        return sealed

    async def land(self, sealed: Sealed) -> Hints | None:
        """Append `sealed` (once every commit sealed before it may go too), and return
        once it and every earlier one landed; raises `RecorderFenced` if the log was
        taken over, and any failure leaves the recorder failed (the store must be played
        again from the log). Returns the sealed hints."""
        if sealed.tail is not None:
            with contextlib.suppress(BaseException):  # (its failure: raised by settle)
                await asyncio.wrap_future(sealed.tail)
            with self.lock:
                if self._encoding_sealed is sealed:
                    self._settle()
        await asyncio.shield(self.release(sealed))
        return sealed.hints

    def release(self, sealed: Sealed) -> asyncio.Future[None]:
        """Let `sealed` go as `land` does, without waiting (its last frame must be
        encoded: no `tail`): the future that is done once it landed."""
        if sealed.tail is not None and not sealed.tail.done():
            raise GazetteError(f"recovery log {self.log}: a commit released while its "
                               "last frame is being encoded (land it instead)")
        sealed.ready = True
        self._pump()
        return sealed.landed

    async def commit(self, *, hints: bool = False) -> Hints | None:
        """Seal what was recorded so far and land it (`seal`, `land`)."""
        return await self.land(self.seal(hints=hints))

    def _fenced(self, err: BaseException) -> BaseException:
        """An append's failure as the recorder keeps it: a refusal that means another
        writer took the log over said so (what every later commit and seal raises too,
        whichever of them surfaces first)."""
        status = getattr(err, "status", "")
        if status in (Status.REGISTER_MISMATCH, Status.WRONG_APPEND_OFFSET):
            fenced = RecorderFenced(f"recovery log {self.log} was taken over by another "
                                    f"writer ({status}): this one is fenced out")
            fenced.__cause__ = err
            return fenced
        return err

    def _raise_failed(self) -> None:
        if self.failed is not None:
            raise RecorderFenced(f"recovery log {self.log}: no longer recording "
                                 f"({self.failed})")

    def _pump(self) -> None:
        """Send what may go: the ready sealed commits at the front, merged."""
        unsent = self._unsent
        if self.failed is not None:
            while unsent:
                sealed = unsent.popleft()
                if not sealed.landed.done():
                    sealed.landed.set_exception(RecorderFenced(
                        f"recovery log {self.log}: no longer recording ({self.failed})"))
            return
        while unsent and unsent[0].ready and len(self._sends) < self.appends_in_flight:
            batch = [unsent.popleft()]
            size = len(batch[0].data)
            while unsent and unsent[0].ready and size + len(unsent[0].data) <= MAX_MERGED_APPEND:
                size += len(unsent[0].data)
                batch.append(unsent.popleft())
            before, self._last_send = self._last_send, \
                asyncio.get_running_loop().create_future()
            self._last_send.add_done_callback(retrieved)  # (failed alike)
            task = asyncio.ensure_future(self._send(batch, before, self._last_send))
            self._sends.add(task)
            task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Future[None]) -> None:
        self._sends.discard(task)
        self._pump()

    async def _send(self, batch: list[Sealed], before: asyncio.Future[None] | None,
                    done: asyncio.Future[None]) -> None:
        offset = batch[0].offset
        parts = [s.data for s in batch if s.data]  # (sent as they are: not joined)
        size = sum(len(part) for part in parts)
        try:
            result = None
            if size:
                result = await self.client.append(self.log, parts, offset=offset,
                                                  check_registers=self._check)
            if before is not None:
                await before  # (landing in order, the results come back in any)
            if result is not None and result.commit.begin != offset:
                raise GazetteError(f"recovery log {self.log}: commit at "
                                   f"{result.commit.begin}, not {offset}")
        except BaseException as err:
            failure: BaseException = self._fenced(err)
            if isinstance(err, asyncio.CancelledError):
                failure = RecorderFenced(f"recovery log {self.log}: an append was "
                                         "cancelled")
            self.failed = self.failed or failure
            for sealed in batch:
                if not sealed.landed.done():
                    sealed.landed.set_exception(failure)
            done.set_exception(failure)
            me = asyncio.current_task()
            for task in self._sends:  # what follows cannot land: stop waiting for it
                if task is not me:
                    task.cancel()
            self._pump()
            if not isinstance(err, Exception):
                raise
            return
        with self.lock:
            self.head = offset + size
            self._inflight -= size
        RECORDED_BYTES.inc(size)
        RECORDED_OPS.inc(sum(s.ops for s in batch))
        for sealed in batch:
            sealed.landed.set_result(None)
        done.set_result(None)

    def hints(self) -> Hints:
        """Hints of what is committed (call between commits)."""
        if self._pending or self._encoding is not None or self._inflight or \
                self._open is not None:
            raise GazetteError(f"recovery log {self.log}: hints asked for with "
                               f"{self.pending_bytes + self._inflight} bytes not committed")
        return self.fsm.hints(self.log)
