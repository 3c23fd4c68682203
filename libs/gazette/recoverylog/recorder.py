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
import logging
import threading

from prometheus_client import Counter

from gazette.client import JournalClient
from gazette.errors import GazetteError
from gazette.labels import LabelSet, Selector
from gazette.protocol.status import Status
from gazette.recoverylog.fsm import FSM, Hints
from gazette.recoverylog.ops import Kind, record

log = logging.getLogger(__name__)

#: The journal register that names the recorder a recovery log belongs to.
AUTHOR_LABEL = "author"

RECORDED_BYTES = Counter("gazette_recoverylog_recorded_bytes_total",
                         "Bytes of file operations appended to recovery logs")
RECORDED_OPS = Counter("gazette_recoverylog_recorded_ops_total",
                       "File operations appended to recovery logs")

#: The most bytes one write operation grows to by extension.
MAX_MERGED_WRITE = 4 << 20


class RecorderFenced(GazetteError):
    """The log was taken over (or an append failed): this recorder writes no more."""


def fence(author: int) -> LabelSet:
    return LabelSet([(AUTHOR_LABEL, f"{author:08x}")])


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
        self._inflight = 0  # bytes of the commit under way (they land at `head`)
        self._committing = asyncio.Lock()
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
            seq_no = fsm.next_seq_no
            # The frame lands here (after a commit under way): commits append at the
            # expected head, in order, or fail.
            frame, op = record(kind, seq_no, fsm.next_checksum, self.author,
                               self.head + self._inflight + len(self._pending),
                               fnode=fnode, offset=offset, length=length, path=path,
                               data=data)
            fsm.apply(op)
            self._pending += frame
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

    def fnode(self, path: str) -> int | None:
        return self.fsm.links.get(path)

    @property
    def pending_bytes(self) -> int:
        return len(self._pending) + (len(self._open[2]) if self._open is not None else 0)

    # -- committing --

    async def commit(self, *, hints: bool = False) -> Hints | None:
        """Append what was recorded since the last commit (one append, at the expected
        head, only while the log is this recorder's); raises `RecorderFenced` if it
        was refused, and any failure leaves the recorder failed (the store must be
        played again from the log). With `hints`, returns the hints of the log as
        this commit leaves it (what is recorded meanwhile is not in them)."""
        async with self._committing:  # one at a time, in the order they were asked
            if self.failed is not None:
                raise RecorderFenced(f"recovery log {self.log}: no longer recording "
                                     f"({self.failed})")
            if not self._pending and self._open is None:
                return self.fsm.hints(self.log) if hints else None
            # What is recorded from now on (the next transaction, while this one
            # commits) goes to a new buffer, after this one.
            with self.lock:
                self._close_write()
                data, ops = self._pending, self._ops
                self._pending, self._ops = bytearray(), 0
                self._inflight = len(data)
                snapshot = self.fsm.hints(self.log) if hints else None
            try:
                result = await self.client.append(self.log, data, offset=self.head,
                                                  check_registers=self._check)
            except BaseException as err:
                self.failed = err
                status = getattr(err, "status", "")
                if status in (Status.REGISTER_MISMATCH, Status.WRONG_APPEND_OFFSET):
                    raise RecorderFenced(f"recovery log {self.log} was taken over by "
                                         f"another writer ({status}): this one is fenced "
                                         "out") from err
                raise
            if result.commit.begin != self.head:  # the broker broke its contract
                self.failed = GazetteError(f"commit at {result.commit.begin}, not "
                                           f"{self.head}")
                raise self.failed
            with self.lock:
                self.head, self._inflight = result.commit.end, 0
            RECORDED_BYTES.inc(len(data))
            RECORDED_OPS.inc(ops)
            return snapshot

    def hints(self) -> Hints:
        """Hints of what is committed (call between commits)."""
        if self._pending or self._inflight or self._open is not None:
            raise GazetteError(f"recovery log {self.log}: hints asked for with "
                               f"{self.pending_bytes + self._inflight} bytes not committed")
        return self.fsm.hints(self.log)
