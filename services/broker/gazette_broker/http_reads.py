"""The content an HTTP read streams: from the replica here or, forwarded, from a broker
that serves one. A read whose journal moves to other brokers (its replica here closes,
or the broker it went to stops serving it) reads on through them from the next offset,
re-routing with backoff for up to `REROUTE_SECONDS` without progress; a journal that is
deleted ends it with `JournalClosed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncGenerator

from gazette.client import ReadChunk
from gazette.cluster import CLOSED_DELETED
from gazette.fragment import JournalClosed
from gazette_broker.errors import StatusError
from gazette_broker.forward import ForwardFailed
from gazette_broker.replica import Replica
from gazette_broker.replica_reads import forwarded_chunks, replica_chunks
from gazette_broker.routing import JournalRouting, JournalUnready, Routed

#: How long a read re-routes without progress before it gives up.
REROUTE_SECONDS = 20.0


class _Moved(Exception):
    """The broker read from stopped serving the journal: route the read again."""


async def read_chunks(routing: JournalRouting, routed: Routed, target: Replica | str,
                      offset: int, block: bool, end: int) -> AsyncGenerator[ReadChunk, None]:
    """Chunks of `routed`'s journal from `offset` (-1: the write head) up to `end`
    (0: none), following appends with `block`; from `target` first (see module doc).
    Close it (``contextlib.aclosing``)."""
    pos, deadline, delay = offset, 0.0, 0.05
    while True:
        try:
            if isinstance(target, str):
                assert routed.res is not None
                chunks = forwarded_chunks(routing, routed.res, target, pos, block, end)
            else:
                chunks = replica_chunks(routing, target, pos, block=block, end=end)
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    pos, deadline, delay = chunk.end, 0.0, 0.05
                    yield chunk
            if isinstance(target, str) and block and not (end and pos >= end):
                raise _Moved()  # a blocking read's stream does not end on its own
            return
        except JournalClosed:
            if isinstance(target, str) or target.closed == CLOSED_DELETED or \
                    routing.resolver is None:
                raise
        except (StatusError, ForwardFailed) as err:  # forwarded, or a gap's read
            if not err.retriable:
                raise
        except _Moved:
            pass
        now = time.monotonic()
        deadline = deadline or now + REROUTE_SECONDS
        while True:  # the journal moved, or its broker went away: route it again
            if now + delay > deadline:
                raise JournalUnready(routed.journal, f"reading {routed.journal}: no broker "
                                     f"served it for {REROUTE_SECONDS:.0f} s")
            await asyncio.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, 1.0)
            try:
                routed = await routing.resolve(routed.journal)
                target = routing.read_target(routed)
                break
            except (StatusError, JournalUnready) as err:
                if not err.retriable:
                    raise
            now = time.monotonic()
