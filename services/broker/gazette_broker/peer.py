"""A replica's peer part: it serves a primary's Replicate stream into the spool, content
committed (or dropped) at each proposal.

One session is served at a time, the newest: a primary opens a stream only after giving
up the last one (which may linger, half-open, until keepalives notice). A session ends
when its stream ends, when the route changes so that its primary is no longer primary
(or this broker no longer a member: WRONG_ROUTE, the primary must sync under the new
one), or when the replica closes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from prometheus_client import Counter

from gazette.fragment import Fragment, ThreadedSha1, fragment_from_pb, fragment_to_pb
from gazette.pb import broker_pb2 as pb
from gazette.protocol import ProcessId, ReplicateContent, labels_from_pb, labels_to_pb
from gazette_broker.replica_state import ReplicaState

REPLICATED_BYTES = Counter("gazette_broker_replicated_bytes_total",
                           "Bytes committed into this broker's spools as a peer")

Reply = Callable[[pb.ReplicateResponse], Awaitable[None]]


class PeerPart:
    """A replica's peer part: it serves primaries' Replicate streams into the spool."""

    def __init__(self, state: ReplicaState) -> None:
        self.state = state
        self.sessions = 0  # sessions started: the latest one is served

    async def replicate(self, first: pb.ReplicateRequest,
                        requests: AsyncIterator[ReplicateContent], reply: Reply) -> None:
        """Serve a primary's Replicate stream whose route the caller verified is ours:
        answer its first proposal, then take content into the spool and commit (or
        drop) it at each proposal, until the stream ends, our route changes (then
        WRONG_ROUTE: the primary must sync under the new one) or the replica closes."""
        state = self.state
        primary = state.resolution.route.primary_id if state.resolution else None
        self.sessions += 1
        session = self.sessions
        state.wake_sessions()
        async with state.lock:
            if session != self.sessions or state.closed:
                return  # superseded while waiting, or closed
            await reply(await self._on_proposal(first))
            try:
                await self._serve(session, primary, requests, reply)
            except BaseException:
                state.spool.rollback()
                raise

    async def _serve(self, session: int, primary: ProcessId | None,
                     requests: AsyncIterator[ReplicateContent], reply: Reply) -> None:
        state = self.state
        summer: ThreadedSha1 | None = None
        changed: asyncio.Future[Any] = asyncio.ensure_future(state.route_changed.wait())
        nxt: asyncio.Future[Any] | None = None
        try:
            while True:
                if nxt is None:
                    nxt = asyncio.ensure_future(anext(requests))
                await asyncio.wait({nxt, changed}, return_when=asyncio.FIRST_COMPLETED)
                if changed.done():
                    if session != self.sessions or state.closed:
                        # Superseded by a newer stream, or the replica closed.
                        state.spool.rollback()
                        if state.closed:
                            await reply(pb.ReplicateResponse(status=pb.WRONG_ROUTE))
                        return
                    # Another route: the session goes on only while its primary is
                    # still the primary (and we a member). It will sync under the
                    # new route after this append; another primary never commits
                    # through an old one's session.
                    if not self._serves(primary):
                        state.spool.rollback()
                        await reply(pb.ReplicateResponse(status=pb.WRONG_ROUTE))
                        return
                    changed = asyncio.ensure_future(state.route_changed.wait())
                if not nxt.done():
                    continue
                try:
                    msg = nxt.result()
                except StopAsyncIteration:
                    state.spool.rollback()
                    return
                nxt = None
                if msg.content:
                    spool = state.spool
                    if msg.meta.content_delta != spool.written - spool.end:
                        spool.rollback()
                        await reply(self._mismatch())
                        return
                    if summer is None:
                        summer = ThreadedSha1(state.shared.hasher, also=[spool.pending_sum],
                                              own=False)
                    spool.write(msg.content, summed=True)
                    await summer.update(msg.content)
                    continue
                if summer is not None:
                    await summer.digest()
                    summer = None
                if not self._serves(primary) or state.closed:
                    state.spool.rollback()
                    await reply(pb.ReplicateResponse(status=pb.WRONG_ROUTE))
                    return
                answer = await self._on_proposal(msg.meta)
                if msg.meta.acknowledge or answer.status != pb.OK:
                    await reply(answer)
                if answer.status != pb.OK:
                    return
        finally:
            changed.cancel()
            if nxt is not None:
                nxt.cancel()

    def _serves(self, primary: ProcessId | None) -> bool:
        """Whether a peer session of `primary` may go on under the current route."""
        res, peering = self.state.resolution, self.state.peering
        return res is not None and peering is not None and primary is not None and \
            res.route.primary_id == primary and peering.me in res.route.members

    async def _on_proposal(self, request: pb.ReplicateRequest) -> pb.ReplicateResponse:
        """Commit the pending content if the proposal is the spool extended by it; drop
        it if the proposal is the spool as committed; roll to it if it is an empty
        fragment at or past our end; otherwise PROPOSAL_MISMATCH with what we hold."""
        state = self.state
        proposal = fragment_from_pb(request.proposal, "proposal")
        spool = state.spool
        if spool.written != spool.end:
            if _same(proposal, spool.pending):
                REPLICATED_BYTES.inc(spool.written - spool.end)
                spool.commit()
                state.index.add(spool.fragment)
                state.registers = labels_from_pb(request.registers, "registers")
                return pb.ReplicateResponse(status=pb.OK)
            spool.rollback()
        if _same(proposal, spool.fragment):
            state.registers = labels_from_pb(request.registers, "registers")
            return pb.ReplicateResponse(status=pb.OK)
        if proposal.begin == proposal.end and proposal.begin >= spool.end:
            registers = labels_from_pb(request.registers, "registers")
            await state.roll_to(proposal.begin, proposal.codec)
            state.registers = registers
            return pb.ReplicateResponse(status=pb.OK)
        return self._mismatch()

    def _mismatch(self) -> pb.ReplicateResponse:
        return pb.ReplicateResponse(status=pb.PROPOSAL_MISMATCH,
                                    fragment=fragment_to_pb(self.state.spool.fragment),
                                    registers=labels_to_pb(self.state.registers))


def _same(a: Fragment, b: Fragment) -> bool:
    return (a.begin, a.end, a.sha1) == (b.begin, b.end, b.sha1)
