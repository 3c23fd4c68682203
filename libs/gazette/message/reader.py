"""Reading messages from a journal's bytes: read-uncommitted and read-committed.

`read_uncommitted` decodes an async stream of byte chunks (as a journal read delivers
them, from some offset) into batches of envelopes, carrying partial frames over to the
next chunk. A frame that cannot be decoded is reported to `on_error` (by default logged
and counted) and reading continues past it. `read_committed` feeds those batches through
a `Sequencer`, serving its replays from a callback that reads a byte range again.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, AsyncIterator, Callable

from prometheus_client import Counter

from gazette.message.base import Envelope, Frame, FrameError, Framing, uuid_of
from gazette.message.sequencer import ReplayRequired, Sequencer

log = logging.getLogger(__name__)

FRAME_ERRORS = Counter("gazette_message_frame_errors_total",
                       "Frames that could not be decoded and were skipped", ["journal"])

ErrorHandler = Callable[[FrameError], None]
#: Reads `journal` again over [begin, end), as batches of read-uncommitted envelopes.
ReplayFunc = Callable[[str, int, int], AsyncIterable[list[Envelope]]]


def log_frame_error(err: FrameError) -> None:
    log.warning("skipping undecodable frame: %s", err)


async def read_uncommitted(
    journal: str,
    chunks: AsyncIterable[bytes | bytearray],
    framing: Framing,
    offset: int = 0,
    on_error: ErrorHandler = log_frame_error,
) -> AsyncIterator[list[Envelope]]:
    """Batches of envelopes from `chunks`, the bytes of `journal` from `offset` on."""
    carry = b""
    base = offset  # journal offset of the first byte of `carry`
    fast = getattr(framing, "decode_envelopes", None)
    async for chunk in chunks:
        data = carry + chunk if carry else bytes(chunk)
        if fast is not None and (got := fast(journal, base, data)) is not None:
            batch, used = got
            carry, base = data[used:], base + used
            if batch:
                yield batch
            continue
        frames, used = framing.decode(data)
        batch = _envelopes(journal, base, frames, on_error)
        # Framings bound what they leave unconsumed (an over-long frame is reported
        # and skipped as it arrives), so `carry` stays under their max_frame.
        carry, base = data[used:], base + used
        if batch:
            yield batch
    if carry:
        frames, used = framing.decode(carry, final=True)
        batch = _envelopes(journal, base, frames, on_error)
        if batch:
            yield batch


def _report(on_error: ErrorHandler, err: FrameError) -> None:
    FRAME_ERRORS.labels(err.journal).inc()
    on_error(err)


def _envelopes(journal: str, base: int, frames: list[Frame], on_error: ErrorHandler
               ) -> list[Envelope]:
    out = []
    for f in frames:
        if f.error is not None:
            _report(on_error, FrameError(journal, base + f.begin, base + f.end, f.error))
            continue
        out.append(Envelope(journal, base + f.begin, base + f.end, f.message,
                            uuid_of(f.message)))
    return out


async def read_committed(
    batches: AsyncIterable[list[Envelope]],
    sequencer: Sequencer,
    replay: ReplayFunc,
) -> AsyncIterator[list[Envelope]]:
    """Batches of committed envelopes, in commit order, from read-uncommitted batches."""
    async for batch in batches:
        sequencer.queue_all(batch)
        out = await drain(sequencer, replay)
        if out:
            yield out


async def drain(sequencer: Sequencer, replay: ReplayFunc) -> list[Envelope]:
    """Every committed envelope the sequencer holds, serving the replays it asks for."""
    out: list[Envelope] = []
    while True:
        try:
            out.extend(sequencer.drain())
        except ReplayRequired as req:
            envs = [env async for b in replay(req.journal, req.begin, req.end) for env in b]
            sequencer.start_replay(envs)
            continue
        if not sequencer.ready:
            return out
