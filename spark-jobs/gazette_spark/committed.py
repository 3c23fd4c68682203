"""Read-committed in batch: the message library's Sequencer over decoded blocks.

Duplicates, rolled-back messages and ACKs never reach Spark; what does is exactly what
`gazette.message.read_committed` yields over the same bytes, in the same order. A block
whose UUIDs are all OUTSIDE_TXN (committed publishing, the common case) from producers
with nothing pending is settled by numpy: such a message commits iff its clock is above
its producer's running last ACK. Other blocks go through the Sequencer a message at a
time, and its replays are served by reading the journal range again. A stream's
micro-batch starts from the producers' states its offset kept (`stream_state`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from gazette.message import PRUNE_HORIZON, Envelope, ProducerState, ReplayRequired, Sequencer
from gazette_spark.decode import Block

#: Ring of the Sequencer: messages of open transactions held before a commit must
#: replay them.
RING = 1 << 16

#: Blocks of a journal's range [begin, end), decoded again.
Replay = Callable[[int, int], Iterator[Block]]


class CommittedReader:
    """Keeps the committed messages of one journal's blocks, fed in order."""

    def __init__(self, journal: str, replay: Replay,
                 states: Iterable[ProducerState] = ()) -> None:
        self.journal = journal
        self.replay = replay
        self.sequencer = Sequencer(states, buffer=RING)
        self.fast_blocks = self.slow_blocks = 0

    def feed(self, block: Block) -> np.ndarray | list[dict[str, Any]]:
        """The committed part of `block`: which of its rows are (a mask), or rows the
        Sequencer released (which may hold messages of earlier blocks)."""
        uu = block.uuids
        if uu is None:
            return np.ones(len(block), dtype=bool)
        keep = self._settle(block)
        if keep is not None:
            self.fast_blocks += 1
            return keep
        self.slow_blocks += 1
        seq = self.sequencer
        for env in _envelopes(self.journal, block):
            seq.queue(env)
        return [env.message for env in self._drain()]

    def states(self) -> list[ProducerState]:
        """Each producer's state after the blocks fed (what a stream's offset keeps)."""
        return self.sequencer.producer_states(PRUNE_HORIZON)

    def _settle(self, block: Block) -> np.ndarray | None:
        uu = block.uuids
        assert uu is not None
        seq = self.sequencer
        if seq.ready or (uu.flags[uu.has] != 0).any():
            return None
        idx = np.flatnonzero(uu.has)
        keep = np.ones(len(block), dtype=bool)
        if not len(idx):
            return keep
        prods, clocks = uu.producer[idx], uu.clock[idx]
        order = np.argsort(prods, kind="stable")
        sp, sc = prods[order], clocks[order]
        bounds = [0, *(np.flatnonzero(sp[1:] != sp[:-1]) + 1).tolist(), len(sp)]
        settled = []
        for a, b in itertools.pairwise(bounds):
            last = seq.settled_clock(self.journal, int(sp[a]))
            if last is None:
                return None
            settled.append((a, b, last))
        for a, b, last in settled:
            c = sc[a:b]
            running = np.maximum.accumulate(np.concatenate(([np.uint64(last)], c[:-1])))
            ok = c > running
            keep[idx[order[a:b]]] = ok
            top = int(c.max())
            seq.acknowledged_outside(self.journal, int(sp[a]), max(last, top), top,
                                     int((~ok).sum()))
        return keep

    def _drain(self) -> list[Envelope]:
        seq, out = self.sequencer, []
        while True:
            try:
                out.extend(seq.drain())
            except ReplayRequired as req:
                seq.start_replay([env for block in self.replay(req.begin, req.end)
                                  for env in _envelopes(self.journal, block)])
                continue
            if not seq.ready:
                return out


def _envelopes(journal: str, block: Block) -> Iterator[Envelope]:
    texts = block.uuid_text.to_pylist() if block.uuid_text is not None else None
    values = block.values.to_pylist()
    data = block.data.to_pylist() if block.data is not None else None
    begins, ends = block.begins.tolist(), block.ends.tolist()
    for i, value in enumerate(values):
        text = texts[i] if texts is not None else None
        uuid = int(text.replace("-", ""), 16) if text else 0
        row = {"offset": begins[i], "value": value, "uuid": text or None,
               "data": data[i] if data is not None else None}
        yield Envelope(journal, begins[i], ends[i], row, uuid)
