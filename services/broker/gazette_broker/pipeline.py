"""The primary's replication pipeline: one Replicate stream to each peer of a route.

The primary opens it by proposing the fragment it holds; each peer answers OK (it holds
the same) or PROPOSAL_MISMATCH with its own. Appends then stream their content to every
peer and end with a proposal of the extended fragment, which each peer commits and
acknowledges; the append commits on the primary only when every peer has. A failure
before that proposal leaves nothing committed anywhere (`ReplicationFailed`); one after
it leaves the outcome unknown (`ReplicationUncertain`): some peers may have committed.
Either way the pipeline is broken, and the next append opens a new one.
`append_outcome` is how either becomes the outcome of an append.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from prometheus_client import Counter

from gazette.allocator import Route
from gazette.client import AppendUncertain
from gazette.cluster import Channels
from gazette.fragment import Fragment, fragment_to_pb
from gazette.labels import LabelSet
from gazette.pb import broker_pb2 as pb
from gazette.protocol import (
    ProcessId,
    Status,
    encode_replicate_content,
    encode_replicate_request,
    labels_to_pb,
)
from gazette_broker.errors import AppendError, StatusError

PIPELINES = Counter("gazette_broker_pipelines_opened_total",
                    "Replication pipelines opened by primaries")
REPLICATION_FAILURES = Counter("gazette_broker_replication_failures_total",
                               "Replications that failed, by whether peers may hold the "
                               "append (uncertain) or not (failed)", ["outcome"])
for _outcome in ("failed", "uncertain"):  # exported at 0: panels see the first
    REPLICATION_FAILURES.labels(_outcome)

REPLICATE_METHOD = "/gazette.broker.Journal/Replicate"
#: How long a peer may take to answer a proposal.
PROPOSAL_TIMEOUT = 10.0


class ReplicationFailed(StatusError):
    """Replication failed before a commit was proposed: nothing was committed."""

    def __init__(self, status: Status, message: str) -> None:
        REPLICATION_FAILURES.labels("failed").inc()
        super().__init__(status, message)


class ReplicationUncertain(Exception):
    """A commit was proposed but not acknowledged by every peer: some may hold it."""

    def __init__(self, message: str) -> None:
        REPLICATION_FAILURES.labels("uncertain").inc()
        super().__init__(message)


@contextlib.contextmanager
def append_outcome(journal: str, *, commits_content: bool) -> Iterator[None]:
    """Turn a replication that failed into what the append answers: `AppendError` when
    nothing was committed; when peers may have committed, `AppendUncertain` if the
    proposal carried the append's content, else (a sync or roll commits no content)
    `AppendError` REPLICATION_FAILED."""
    try:
        yield
    except ReplicationFailed as err:
        raise AppendError(err.status, err.message) from None
    except ReplicationUncertain as err:
        if commits_content:
            raise AppendUncertain(journal, str(err)) from None
        raise AppendError(Status.REPLICATION_FAILED, str(err)) from None


@dataclass
class _Peer:
    id: ProcessId
    endpoint: str
    call: Any  # grpc.aio.StreamStreamCall


class Pipeline:
    """Open streams to the peers of `route` (no peers: replication 1)."""

    def __init__(self, journal: str, route: Route, peers: list[_Peer]) -> None:
        self.journal, self.route, self._peers = journal, route, peers
        self.broken = False

    @classmethod
    async def open(cls, journal: str, route: Route, header: pb.Header,
                   peers: Sequence[tuple[ProcessId, str]], channels: Channels,
                   proposal: Fragment, registers: LabelSet
                   ) -> tuple[Pipeline, list[pb.ReplicateResponse]]:
        """Streams to `peers` (id, endpoint), each sent the first proposal; their
        answers, peer by peer. `ReplicationFailed` if a peer cannot be reached."""
        for pid, endpoint in peers:  # before any stream is opened: none to clean up
            if not endpoint:
                raise ReplicationFailed(Status.REPLICATION_FAILED,
                                        f"peer {pid} of {journal} has no endpoint")
        opened = []
        for pid, endpoint in peers:
            method = channels.get(endpoint).stream_stream(
                REPLICATE_METHOD, request_serializer=encode_replicate_request,
                response_deserializer=pb.ReplicateResponse.FromString)
            opened.append(_Peer(pid, endpoint,  # (this broker's own authority: REPLICATE)
                                method(metadata=channels.own())))  # type: ignore[call-arg]
        pipeline = cls(journal, route, opened)
        PIPELINES.inc()
        first = pb.ReplicateRequest(header=header, journal=journal,
                                    proposal=fragment_to_pb(proposal),
                                    registers=labels_to_pb(registers), acknowledge=True)
        try:
            replies = await pipeline._exchange(first)
        except ReplicationUncertain as err:  # nothing was pending: nothing committed
            pipeline.close()
            raise ReplicationFailed(Status.REPLICATION_FAILED, str(err)) from None
        wrong = [(p, r) for p, r in zip(opened, replies, strict=True)
                 if r.status == pb.WRONG_ROUTE]
        if wrong:
            pipeline.close()
            raise ReplicationFailed(Status.WRONG_ROUTE, f"peer {wrong[0][0].id} of {journal} "
                                    f"does not agree on route {route} yet")
        return pipeline, replies

    async def send(self, chunk: bytes | memoryview, delta: int) -> None:
        """Stream `chunk` (at `delta` bytes into the pending append) to every peer."""
        if not self._peers:
            return
        raw = encode_replicate_content(chunk, delta)
        try:
            await asyncio.gather(*(p.call.write(raw) for p in self._peers))
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as err:
            self.close()
            raise ReplicationFailed(Status.REPLICATION_FAILED,
                                    f"streaming to a peer of {self.journal}: {_why(err)}") \
                from None

    async def propose(self, fragment: Fragment, registers: LabelSet) -> None:
        """Have every peer commit `fragment` (an extension of what it holds, or an
        empty one at or past its end: a roll). `ReplicationFailed` if every peer
        refused it, `ReplicationUncertain` if only some did, or if a peer could not
        answer."""
        if not self._peers:
            return
        request = pb.ReplicateRequest(proposal=fragment_to_pb(fragment),
                                      registers=labels_to_pb(registers), acknowledge=True)
        replies = await self._exchange(request)
        refused = [(peer, reply) for peer, reply in zip(self._peers, replies, strict=True)
                   if reply.status != pb.OK]
        if refused:
            self.close()
            peer, reply = refused[0]
            why = (f"peer {peer.id} answered {pb.Status.Name(reply.status)} to the "
                   f"proposal of {fragment.journal} [{fragment.begin}, {fragment.end})")
            if len(refused) == len(self._peers):  # no peer committed it
                raise ReplicationFailed(Status.REPLICATION_FAILED, why)
            raise ReplicationUncertain(why)

    async def _exchange(self, request: pb.ReplicateRequest) -> list[pb.ReplicateResponse]:
        async def one(peer: _Peer) -> pb.ReplicateResponse:
            await peer.call.write(request)
            reply = await peer.call.read()
            if reply is grpc.aio.EOF:  # type: ignore[attr-defined]
                code = await peer.call.code()
                raise ReplicationUncertain(f"peer {peer.id} ended the stream ({code.name}: "
                                           f"{await peer.call.details()})")
            return reply  # type: ignore[no-any-return]

        try:
            async with asyncio.timeout(PROPOSAL_TIMEOUT):
                return list(await asyncio.gather(*(one(p) for p in self._peers)))
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, TimeoutError) as err:
            self.close()
            raise ReplicationUncertain(f"replicating {self.journal}: {_why(err)}") from None
        except ReplicationUncertain:
            self.close()
            raise

    def close(self) -> None:
        """Break the pipeline: peers drop whatever is pending."""
        self.broken = True
        for p in self._peers:
            p.call.cancel()


def _why(err: BaseException) -> str:
    if isinstance(err, grpc.aio.AioRpcError):
        return f"{err.code().name}: {err.details()}"
    if isinstance(err, TimeoutError):
        return f"no answer within {PROPOSAL_TIMEOUT:.0f}s"
    return type(err).__name__
