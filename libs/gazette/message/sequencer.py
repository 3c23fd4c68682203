"""The Sequencer: read-uncommitted envelopes in, read-committed envelopes out.

Producers write messages of a transaction as CONTINUE_TXN and later commit them with an
ACK_TXN whose clock is at least theirs; pending messages with larger clocks are rolled
back, and an ACK not above the producer's last ACK rolls back everything pending (a
producer that failed and recovered re-writes its last committed ACK). An OUTSIDE_TXN
message commits itself. These are Gazette's semantics. Appends are retried
at-least-once, so any message may appear twice.
The Sequencer turns that stream into exactly the committed messages, each once, in each
producer's order, without head-of-line blocking: a producer's messages are released as
soon as its ACK is read, whatever other producers still have pending.

Pending messages wait in a ring buffer of bounded size. When an ACK commits messages that
already left the ring (or that precede a restore from checkpointed `ProducerState`s),
`dequeue()` raises `ReplayRequired` with the exact byte range to read again; the caller
reads it and hands the envelopes to `start_replay`, then dequeues on.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from gazette.errors import GazetteError
from gazette.message.base import Envelope

log = logging.getLogger(__name__)

_PRODUCER_MASK = 0xFFFFFFFFFFFF
_FLAG_CONTINUE, _FLAG_ACK = 0x1, 0x2
#: Clock units (100 ns ticks, 4 counter bits) per second, for prune horizons.
CLOCK_UNITS_PER_SECOND = 10_000_000 << 4
#: Seconds a producer may be silent, behind the newest producer of its journal, before
#: a checkpoint (a shard's, a Spark stream's) forgets it, as Gazette's do: every restart
#: of a publisher makes a new producer id, and the old one's state would be kept for
#: ever. A forgotten producer's messages, if any came, would be read as a new producer's.
PRUNE_HORIZON = 24 * 3600.0


def _clock(u: int) -> int:
    return ((((u >> 64) & 0x0FFF) << 48 | ((u >> 80) & 0xFFFF) << 32 | (u >> 96)) << 4) | (
        (u >> 58) & 0xF)


@dataclass(slots=True)
class ProducerState:
    """What a Sequencer must remember of a producer across a restart (checkpointed with
    consumer transactions): the clock of its last ACK_TXN or OUTSIDE_TXN message, the
    offset of its first pending (CONTINUE_TXN) message, or -1 if none is pending, and
    the clock of the last message read from it (0: `last_ack`), which prunes it once it
    has been silent for long."""

    journal: str
    producer: int
    last_ack: int
    begin: int = -1
    last_seen: int = 0


class ReplayRequired(GazetteError):
    """Committed messages must be read again from `journal` at [begin, end): read them
    (uncommitted) and pass the envelopes to `Sequencer.start_replay`."""

    def __init__(self, journal: str, begin: int, end: int) -> None:
        self.journal, self.begin, self.end = journal, begin, end
        super().__init__(f"replay {journal} from {begin} to {end}")


class _Partial:
    """One producer's sequence within one journal."""

    __slots__ = ("last_ack", "last_seen", "pending", "restored_begin")

    def __init__(self, last_ack: int = 0, restored_begin: int = -1) -> None:
        self.last_ack = last_ack
        #: Clock of the last message read (for prune horizons).
        self.last_seen = last_ack
        #: (clock, ring sequence number, begin, end) of pending messages, clocks increasing.
        self.pending: list[tuple[int, int, int, int]] = []
        #: Before a restore, pending messages began here (their clocks are unknown).
        self.restored_begin = restored_begin


@dataclass(slots=True)
class _Replay:
    """Committed messages to read again, then in-ring ones to emit after them."""

    journal: str
    producer: int
    begin: int
    end: int
    after_clock: int  # emit clocks > this ...
    through_clock: int  # ... and <= this
    then: list[tuple[int, Envelope]]
    source: Iterator[Envelope] | None = None
    emitted_clock: int = field(default=0)


class Sequencer:
    """Sequences read-uncommitted envelopes of any number of journals and producers.

    Call `queue(env)` for each envelope read, then `dequeue()` until it returns None
    (handling `ReplayRequired`), or use `queue_all`/`drain` for batches.
    """

    def __init__(self, states: Iterable[ProducerState] = (), buffer: int = 4096) -> None:
        if buffer < 1:
            raise ValueError(f"buffer must hold at least one message, got {buffer}")
        self._size = buffer
        self._ring: list[Envelope | None] = [None] * buffer
        self._seq = 0  # ring sequence number of the next pending message
        self._partials: dict[tuple[str, int], _Partial] = {}
        self._work: collections.deque[Envelope | _Replay] = collections.deque()
        for st in states:
            partial = self._partials[(st.journal, st.producer)] = _Partial(st.last_ack,
                                                                           st.begin)
            partial.last_seen = max(st.last_seen, st.last_ack)
        #: Counters, for metrics and tests.
        self.duplicates = 0
        self.rolled_back = 0
        self.replays = 0

    # -- input --

    def queue(self, env: Envelope) -> None:
        """Apply the next read-uncommitted envelope."""
        u = env.uuid
        if not u:  # carries no UUID: at-least-once, committed as read
            self._work.append(env)
            return
        key = (env.journal, u & _PRODUCER_MASK)
        partial = self._partials.get(key)
        if partial is None:
            partial = self._partials[key] = _Partial()
        clock = _clock(u)
        flags = (u >> 48) & 0x3FF
        if clock > partial.last_seen:
            partial.last_seen = clock

        if flags & _FLAG_ACK:
            self._acknowledge(key, partial, clock, env)
        elif flags & _FLAG_CONTINUE:
            pending = partial.pending
            if clock <= partial.last_ack or (pending and clock <= pending[-1][0]):
                self.duplicates += 1  # a re-sent append, or a message already settled
                return
            seq = self._seq
            self._ring[seq % self._size] = env
            self._seq = seq + 1
            pending.append((clock, seq, env.begin, env.end))
        elif clock <= partial.last_ack:
            self.duplicates += 1
        else:
            # OUTSIDE_TXN commits itself. A span still pending is rolled back: mixing
            # committed and transactional publishing to one journal is misuse.
            if partial.pending or partial.restored_begin >= 0:
                self.rolled_back += len(partial.pending) + (partial.restored_begin >= 0)
                partial.pending.clear()
                partial.restored_begin = -1
            partial.last_ack = clock
            self._work.append(env)

    def settled_clock(self, journal: str, producer: int) -> int | None:
        """The clock of the producer's last ACK or OUTSIDE_TXN message (0 if it was never
        seen) while none of its messages wait for an ACK; None while some do. With
        `acknowledged_outside`, this lets a batch reader commit runs of OUTSIDE_TXN
        messages itself, many at a time (they commit iff their clock is above the
        running last ACK), and queue only the rest."""
        partial = self._partials.get((journal, producer))
        if partial is None:
            return 0
        if partial.pending or partial.restored_begin >= 0:
            return None
        return partial.last_ack

    def acknowledged_outside(self, journal: str, producer: int, last_ack: int,
                             last_seen: int, duplicates: int = 0) -> None:
        """Record OUTSIDE_TXN messages of a settled producer (see `settled_clock`) that
        the caller committed (or found duplicate) itself: the clock of the last one it
        committed, the newest it read, and how many were duplicates. Only when nothing
        waits to be dequeued, so commit order is kept."""
        if self._work:
            raise RuntimeError("acknowledged_outside while committed messages wait")
        key = (journal, producer)
        partial = self._partials.get(key)
        if partial is None:
            partial = self._partials[key] = _Partial()
        if partial.pending or partial.restored_begin >= 0:
            raise RuntimeError(f"producer {producer:012x} of {journal} has messages pending")
        partial.last_ack = max(partial.last_ack, last_ack)
        partial.last_seen = max(partial.last_seen, last_seen)
        self.duplicates += duplicates

    def queue_all(self, envs: Iterable[Envelope]) -> None:
        """`queue` each envelope in turn. The common case, a CONTINUE_TXN message of the
        producer of the message before, is inlined here; the rest go through `queue`."""
        partials, ring, size = self._partials, self._ring, self._size
        journal, producer, partial = None, -1, _Partial()
        for env in envs:
            u = env.uuid
            if (u >> 48) & 0x3 != _FLAG_CONTINUE:  # ACK_TXN, OUTSIDE_TXN, or no UUID
                self.queue(env)
                continue
            if u & _PRODUCER_MASK != producer or env.journal is not journal:
                journal, producer = env.journal, u & _PRODUCER_MASK
                found = partials.get((journal, producer))
                if found is None:
                    found = partials[(journal, producer)] = _Partial()
                partial = found
            clock = ((((u >> 64) & 0x0FFF) << 48 | ((u >> 80) & 0xFFFF) << 32 | (u >> 96))
                     << 4) | ((u >> 58) & 0xF)
            if clock > partial.last_seen:
                partial.last_seen = clock
            pending = partial.pending
            if clock <= partial.last_ack or (pending and clock <= pending[-1][0]):
                self.duplicates += 1
                continue
            seq = self._seq
            ring[seq % size] = env
            self._seq = seq + 1
            pending.append((clock, seq, env.begin, env.end))

    def _acknowledge(self, key: tuple[str, int], partial: _Partial, clock: int,
                     env: Envelope) -> None:
        pending = partial.pending
        if clock <= partial.last_ack:
            # An ACK not above the last one: the producer recovered and re-wrote an ACK
            # it had checkpointed, so all it has pending since is rolled back. An ACK
            # *below* the last means the checkpoint it recovered was out of date; like
            # Gazette, reset to it (at-least-once for that interval) rather than risk
            # dropping messages it re-sends.
            if clock < partial.last_ack:
                log.warning("%s: producer %012x ACK at clock %d is older than its last "
                            "ACK %d (recovered from an old checkpoint?)", key[0], key[1],
                            clock, partial.last_ack)
            self.rolled_back += len(pending) + (partial.restored_begin >= 0)
            self.duplicates += clock == partial.last_ack and not pending
            pending.clear()
            partial.restored_begin = -1
            partial.last_ack = clock
            return
        cut = len(pending)
        while cut and pending[cut - 1][0] > clock:
            cut -= 1
        committed, rolled = pending[:cut], len(pending) - cut
        self.rolled_back += rolled
        pending.clear()
        after = partial.last_ack
        partial.last_ack = clock
        restored = partial.restored_begin
        partial.restored_begin = -1

        oldest = self._seq - self._size  # ring sequence numbers below this are gone
        evicted = 0
        while evicted < len(committed) and committed[evicted][1] < oldest:
            evicted += 1
        ring, size = self._ring, self._size
        kept = [(c, ring[s % size]) for c, s, _, _ in committed[evicted:]]
        if restored < 0 and not evicted:
            self._work.extend(e for _, e in kept)  # type: ignore[misc]
            return
        # Some committed messages are not in the ring: replay their exact range first.
        begin = restored if restored >= 0 else committed[0][2]
        if evicted:
            end = committed[evicted - 1][3]
        elif committed:
            end = committed[0][2]
        else:
            end = env.begin
        self._work.append(_Replay(key[0], key[1], begin, end, after, clock,
                                  kept))  # type: ignore[arg-type]

    # -- output --

    def dequeue(self) -> Envelope | None:
        """The next committed envelope, or None when none is ready. Raises
        `ReplayRequired` when committed messages must first be read again."""
        work = self._work
        while work:
            item = work[0]
            if type(item) is Envelope:
                work.popleft()
                return item
            assert isinstance(item, _Replay)
            if item.source is None:
                self.replays += 1
                raise ReplayRequired(item.journal, item.begin, item.end)
            found = self._next_replayed(item)
            if found is not None:
                return found
            work.popleft()
            rest = [env for clock, env in item.then if clock > item.emitted_clock]
            work.extendleft(reversed(rest))
        return None

    def _next_replayed(self, item: _Replay) -> Envelope | None:
        assert item.source is not None
        producer = item.producer
        for env in item.source:
            u = env.uuid
            if (not u or env.journal != item.journal or u & _PRODUCER_MASK != producer
                    or not (u >> 48) & _FLAG_CONTINUE or (u >> 48) & _FLAG_ACK):
                continue
            clock = _clock(u)
            low = max(item.after_clock, item.emitted_clock)
            if low < clock <= item.through_clock:
                item.emitted_clock = clock
                return env
        return None

    def drain(self) -> list[Envelope]:
        """Every committed envelope ready now (stops at a `ReplayRequired`, which it
        raises only if nothing was drained before it)."""
        out: list[Envelope] = []
        work = self._work
        while work:
            if type(work[0]) is Envelope:
                out.append(work.popleft())  # type: ignore[arg-type]
                continue
            try:
                env = self.dequeue()
            except ReplayRequired:
                if out:
                    return out
                raise
            if env is None:
                break
            out.append(env)
        return out

    def start_replay(self, envs: Iterable[Envelope]) -> None:
        """Supply the envelopes read from the range of the last `ReplayRequired`."""
        if not self._work or type(self._work[0]) is not _Replay:
            raise RuntimeError("start_replay without a ReplayRequired pending")
        item = self._work[0]
        assert isinstance(item, _Replay)
        item.source = iter(envs)

    # -- checkpoints --

    @property
    def ready(self) -> bool:
        """Whether committed envelopes (or a replay) wait to be dequeued."""
        return bool(self._work)

    def producer_states(self, prune_horizon: float = 0.0) -> list[ProducerState]:
        """A snapshot of every producer's state, to checkpoint. Producers whose last
        message is older than `prune_horizon` seconds before their journal's newest
        producer's are forgotten, here too (0: keep all): a producer restarts with a
        new id, and the old one's state would be kept for ever. Only when nothing waits
        to be dequeued."""
        if self._work:
            raise RuntimeError("producer_states while committed messages wait to dequeue")
        if prune_horizon > 0:
            newest: dict[str, int] = {}
            for (journal, _), p in self._partials.items():
                newest[journal] = max(newest.get(journal, 0), p.last_seen)
            horizon = int(prune_horizon * CLOCK_UNITS_PER_SECOND)
            self._partials = {k: p for k, p in self._partials.items()
                              if p.last_seen >= newest[k[0]] - horizon}
        states = []
        for (journal, producer), p in self._partials.items():
            begin = p.restored_begin if p.restored_begin >= 0 else (
                p.pending[0][2] if p.pending else -1)
            states.append(ProducerState(journal, producer, p.last_ack, begin,
                                        p.last_seen if p.last_seen > p.last_ack else 0))
        return states
