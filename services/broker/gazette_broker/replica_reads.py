"""Reads served by this broker: its replica's content, with any gap in it read from the
journal's primary, and reads forwarded to another broker, decoded into chunks.

A replica that joined a journal's route late (a broker restarted, say) rolled past
content only its peers hold; that content reaches the stores only once the primary's
spool rolls (up to the fragment's flush interval later). Waiting for that, a consumer
reading through the restarted broker stalled for up to a minute while the primary held
every byte it wanted. So a read that meets a gap reads it from the primary, through the
end of the gap, and goes on from its own replica; if the primary cannot be reached the
failure is the caller's to retry (a gRPC client retries the read, the HTTP edge routes
it again). Only a replica that is itself the primary, or a read that must not be
forwarded (``do_not_proxy``), waits in the gap (`gazette_broker.reads`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator

from prometheus_client import Counter

from gazette.client import ReadChunk
from gazette.cluster import Resolution
from gazette.fragment import fragment_from_pb
from gazette.pb import broker_pb2 as pb
from gazette.protocol import JournalSpec, Status
from gazette_broker.forward import forward_read
from gazette_broker.reads import InGap, ReadError
from gazette_broker.replica import Replica
from gazette_broker.routing import JournalRouting

GAPS_FORWARDED = Counter("gazette_broker_read_gaps_forwarded_total",
                         "Gaps of a replica that reads read from the journal's primary")


async def replica_chunks(routing: JournalRouting, replica: Replica, offset: int, *,
                         block: bool, end: int, forward: bool = True
                         ) -> AsyncGenerator[ReadChunk, None]:
    """`replica`'s content from `offset` (-1: the write head) up to `end` (0: none),
    following appends with `block`; a gap is read from the journal's primary unless not
    `forward`. Raises what `Replica.read` and `forward_read` raise. Close it
    (``contextlib.aclosing``)."""
    journal, pos, served = replica.spec.name, offset, False
    while True:
        res = _primary_elsewhere(routing, journal) if forward else None
        try:
            async with contextlib.aclosing(replica.read(
                    pos, block=block, end_offset=end, leave_gaps=res is not None)) as chunks:
                async for chunk in chunks:
                    pos, served = chunk.end, True
                    yield chunk
            return
        except ReadError as err:
            if served and err.status is Status.OFFSET_NOT_YET_AVAILABLE:
                return  # a gap read through to the write head: done
            raise
        except InGap as gap:
            assert res is not None
            GAPS_FORWARDED.inc()
            stop = min(gap.end, end) if end else gap.end
            async with contextlib.aclosing(forwarded_chunks(
                    routing, res, res.primary_endpoint, gap.offset, True, stop)) as chunks:
                async for chunk in chunks:
                    pos, served = chunk.end, True
                    yield chunk
            # It ended at `stop`: past what the primary skipped too, if it gave up a
            # gap of its own (else the gap here would be read from it again, for ever).
            pos = max(pos, stop)


def _primary_elsewhere(routing: JournalRouting, journal: str
                       ) -> Resolution[JournalSpec] | None:
    """`journal`'s resolution if its primary is another broker this one can reach."""
    resolver = routing.resolver
    if resolver is None or routing.channels is None:
        return None
    res = resolver.resolve(journal)
    if not res.primary_endpoint or res.route.primary_id == resolver.me:
        return None
    return res


async def forwarded_chunks(routing: JournalRouting, res: Resolution[JournalSpec],
                           endpoint: str, pos: int, block: bool, end: int
                           ) -> AsyncGenerator[ReadChunk, None]:
    """Chunks of `res`'s journal read through the broker at `endpoint` from `pos`, cut
    at `end`. Close it (``contextlib.aclosing``)."""
    request = pb.ReadRequest(journal=res.item, offset=pos, block=block, end_offset=end)
    async with contextlib.aclosing(forward_read(routing.forwarding, endpoint, request,
                                                routing.header(res=res))) as parts:
        async for part in parts:
            meta, content = part.meta, part.content
            if pos >= 0 and meta.offset < pos:  # never yield a byte twice
                content = content[pos - meta.offset:]
            at = max(meta.offset, pos)
            if end and at + len(content) > end:
                content = content[:end - at]
            if content:
                pos = at + len(content)
                yield ReadChunk(at, content, fragment_from_pb(meta.fragment),
                                meta.write_head)
