"""A stream's offsets: where each journal's last micro-batch ended and, read committed,
each producer's Sequencer state there.

Read uncommitted, an offset is the journal's byte offset (``{"a/b": 1024}``). Read
committed, a micro-batch must start where the last one left the Sequencer: which clock
each producer last acknowledged (a message re-sent at or below it is a duplicate) and
where its pending transaction began (an ACK read later commits messages the last batch
read). So the offset keeps both, ``{"a/b": {"end": 1024, "producers": [[producer,
last_ack, begin, last_seen], ...]}}``, and the driver computes them when it ends a batch
by sequencing the batch's bytes itself (`sequence`): Spark writes a batch's end offset
before any executor reads it, so nobody else can. That read is the price of a committed
stream: each byte is read twice, once on the driver and once by an executor, the way
Kafka's read-committed consumers wait on the last stable offset. An executor starts from
the states of the batch's start and reads again from the earliest pending begin to
replay what an ACK commits (`committed_slices`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from gazette.errors import ValidationError
from gazette_spark import plan as planning
from gazette_spark.options import ReadOptions
from gazette_spark.slices import SliceReader

#: A producer's state as an offset keeps it: producer, last ACK clock, begin of its
#: pending messages (-1: none), clock last seen (0: its last ACK's).
State = tuple[int, int, int, int]

#: What the driver decodes to sequence a batch (UUIDs; values are not kept).
_SEQUENCING_SCHEMA = pa.schema([("offset", pa.int64())])


class OffsetError(ValidationError):
    """A stream offset (from a checkpoint) that is not one this source wrote."""

    def __init__(self, journal: str, reason: str) -> None:
        super().__init__(f"stream offset of {journal!r}", reason)


def ends_of(offsets: Mapping[str, Any]) -> dict[str, int]:
    """Each journal's end offset, read committed or not (a checkpoint written with
    ``readCommitted`` off resumes with it on, and back)."""
    out = {}
    for journal, value in offsets.items():
        end = value.get("end") if isinstance(value, dict) else value
        if isinstance(end, bool) or not isinstance(end, int) or end < 0:
            raise OffsetError(journal, f"{value!r} is neither an offset nor "
                              '{"end": offset, "producers": [...]}')
        out[journal] = end
    return out


def states_of(offsets: Mapping[str, Any]) -> dict[str, tuple[State, ...]]:
    """Each journal's producer states (none for a plain offset)."""
    out: dict[str, tuple[State, ...]] = {}
    for journal, value in offsets.items():
        rows = value.get("producers", []) if isinstance(value, dict) else []
        if not isinstance(rows, list) or not all(
                isinstance(r, list) and len(r) == 4 and all(
                    isinstance(x, int) and not isinstance(x, bool) for x in r)
                for r in rows):
            raise OffsetError(journal, "producers must be [producer, last_ack, begin, "
                              "last_seen] lists of integers")
        out[journal] = tuple((r[0], r[1], r[2], r[3]) for r in rows)
    return out


def encode(ends: Mapping[str, int], states: Mapping[str, tuple[State, ...]],
           committed: bool) -> dict[str, Any]:
    """The offset Spark checkpoints for a batch ending at `ends`."""
    if not committed:
        return dict(ends)
    return {j: {"end": end, "producers": [list(s) for s in states.get(j, ())]}
            for j, end in ends.items()}


def committed_slices(found: planning.Found, opts: ReadOptions, start: Mapping[str, Any],
                     ends: Mapping[str, int]) -> list[planning.Slice]:
    """A read-committed micro-batch from `start` to `ends`: a slice per journal with bytes
    past its start, holding the pieces from its earliest pending transaction on (to
    replay) and the producers' states at its start."""
    begins, states = ends_of(start), states_of(start)
    replay_from = {j: min([begins[j], *(s[2] for s in states[j] if s[2] >= 0)])
                   for j in begins}
    the_plan = planning.plan(found, opts, replay_from)
    out = []
    for journal, pieces in the_plan.pieces.items():
        begin = begins.get(journal, -1)
        if journal in ends and pieces and pieces[-1].end > begin:
            out.append(planning.Slice(journal, tuple(pieces), begin,
                                      states.get(journal, ())))
    return out


def sequence(slices: list[planning.Slice], opts: ReadOptions
             ) -> dict[str, tuple[State, ...]]:
    """Each slice's journal's producer states at its end, read on the driver."""
    return {s.journal: tuple(SliceReader(s, opts, _SEQUENCING_SCHEMA).sequenced())
            for s in slices}
