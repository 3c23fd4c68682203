"""Where a request's journal is served, for both edges (gRPC and HTTP): the replica here
(if any), the journal's resolution in a cluster (after catching up with the revision the
request's header pins), and where an append or a read goes from there.

Resolution returns a `Routed` or raises: `ValidationError` (a bad name or header),
`JournalUnready` (the journal cannot be served yet: nothing was done, retry). Where a
request goes is a replica here, an endpoint to forward to, or a `Refused` carrying the
protocol's `Status`. Each edge turns those into its own answers (gRPC statuses and
response headers; HTTP codes).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gazette import names
from gazette.cluster import Channels, Resolution, Resolver
from gazette.errors import GazetteError
from gazette.keyspace import Etcd, KeySpace, Layout
from gazette.pb import broker_pb2 as pb
from gazette.protocol import JournalSpec, MemberSpec, Status
from gazette_broker.errors import StatusError
from gazette_broker.replica import Replica

#: How long a request for a journal assigned here waits for its replica to open.
OPEN_WAIT_SECONDS = 5.0


class JournalUnready(GazetteError):
    """The journal has a spec but cannot be served here yet: nothing was done; retry.
    `soon`: its replica is being opened (else its spec cannot be served as it is, e.g.
    its stores cannot be used, until the spec or the broker changes)."""

    retriable = True

    def __init__(self, journal: str, reason: str, soon: bool = False) -> None:
        self.journal, self.reason, self.soon = journal, reason, soon
        super().__init__(reason)


class Refused(StatusError):
    """The request goes nowhere: `status` says why (the journal does not exist, has no
    primary, or the request asked not to be forwarded); `res` is the resolution the
    answer's header carries."""

    status: Status

    def __init__(self, status: Status, message: str,
                 res: Resolution[JournalSpec] | None) -> None:
        super().__init__(status, message)
        self.res = res


@dataclass(frozen=True, slots=True)
class Routed:
    """A request's journal as resolved: `res` None on a lone broker (no cluster);
    `replica` None when this broker serves no replica of it."""

    journal: str
    res: Resolution[JournalSpec] | None
    replica: Replica | None

    @property
    def spec(self) -> JournalSpec | None:
        if self.res is not None:
            return self.res.spec
        return self.replica.spec if self.replica is not None else None


class JournalRouting:
    """What every edge of a broker shares to route requests: `replicas` served here;
    with `etcd`, `keyspace` and `layout`, specs can be applied and listed; `member`
    names this broker in response headers. With `resolver` (a broker in a cluster),
    requests are routed by the journal's assignments and forwarded over `channels`;
    `wait_serving` waits until this broker has opened given journals."""

    def __init__(self, replicas: Mapping[str, Replica], etcd: Etcd | None = None,
                 keyspace: KeySpace[Any] | None = None, layout: Layout | None = None,
                 member: MemberSpec | None = None,
                 unready: Mapping[str, str] | None = None,
                 resolver: Resolver[JournalSpec] | None = None, channels: Channels | None = None,
                 wait_serving: Callable[[set[str]], Awaitable[None]] | None = None
                 ) -> None:
        self.replicas = replicas
        #: Journals with a spec that cannot be served yet, and why.
        self.unready: Mapping[str, str] = unready if unready is not None else {}
        self.etcd, self.keyspace, self.layout = etcd, keyspace, layout
        self.member = member
        self.resolver, self.channels = resolver, channels
        self._wait_serving = wait_serving
        self.lone_route = pb.Route(primary=-1)
        self._process_id = pb.ProcessSpec.ID()
        if member is not None:
            self._process_id = pb.ProcessSpec.ID(zone=member.id.zone, suffix=member.id.suffix)
            self.lone_route = pb.Route(
                members=[self._process_id], primary=0, endpoints=[member.endpoint],
                data_endpoints=[member.data_endpoint] if member.data_endpoint else [])

    def header(self, revision: int | None = None, res: Resolution[JournalSpec] | None = None
               ) -> pb.Header:
        """The response header: this broker, the route of `res` (a lone broker's own),
        and the etcd revision (`revision`, e.g. an Apply's own, else the resolution's)."""
        if self.resolver is not None:
            header = self.resolver.header(res)
            if revision is not None:
                header.etcd.revision = revision
            return header
        if revision is None:
            revision = self.keyspace.revision if self.keyspace is not None else 0
        return pb.Header(process_id=self._process_id, route=self.lone_route,
                         etcd=pb.Header.Etcd(revision=revision))

    def _replica(self, journal: str) -> Replica | None:
        replica = self.replicas.get(journal)
        if replica is None and journal in self.unready:
            raise JournalUnready(journal, self.unready[journal])
        return replica

    async def resolve(self, journal: str, header: pb.Header | None = None) -> Routed:
        """Where `journal` is served (a request pinned to a newer revision waits for it,
        briefly). A journal assigned here whose replica is still being opened is waited
        for, briefly too. Raises `ValidationError` or `JournalUnready`."""
        names.validate_journal_name(journal, "journal")
        replica = self._replica(journal)
        if self.resolver is None:
            return Routed(journal, None, replica)
        res = await self.resolver.resolve_at(journal, header)
        if replica is None and self.resolver.me in res.route.members and \
                self._wait_serving is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(OPEN_WAIT_SECONDS):
                    await self._wait_serving({journal})
            replica = self._replica(journal)
            if replica is None and res.spec is not None and self.resolver.is_assigned(journal):
                raise JournalUnready(journal, f"journal {journal} is assigned to this broker "
                                     "and still being opened (its fragment stores are "
                                     "listed first); retry", soon=True)
        return Routed(journal, res, replica)

    def append_target(self, routed: Routed, forward: bool = True) -> Replica | str:
        """Where an append of `routed` is taken: the replica here (this broker is its
        primary, or alone), else the primary's endpoint (unless not `forward`). Raises
        `Refused`."""
        res, replica = routed.res, routed.replica
        if res is None or (replica is not None and replica.is_primary):
            if replica is None:
                raise Refused(Status.JOURNAL_NOT_FOUND, routed.journal, res)
            return replica
        if res.spec is None:
            raise Refused(Status.JOURNAL_NOT_FOUND, routed.journal, res)
        if not forward:
            raise Refused(Status.NOT_JOURNAL_PRIMARY_BROKER,
                          f"this broker is not the primary of {routed.journal}", res)
        assert self.resolver is not None
        if not res.primary_endpoint or res.route.primary_id == self.resolver.me:
            raise Refused(Status.NO_JOURNAL_PRIMARY_BROKER,
                          f"{routed.journal} has no primary broker now", res)
        return res.primary_endpoint

    def read_target(self, routed: Routed, forward: bool = True) -> Replica | str:
        """Where a read of `routed` is served: the replica here, else a replica's
        endpoint (one in this broker's zone if any), unless not `forward`. Raises
        `Refused`."""
        res, replica = routed.res, routed.replica
        if replica is not None:
            return replica
        if res is None or res.spec is None:
            raise Refused(Status.JOURNAL_NOT_FOUND, routed.journal, res)
        assert self.resolver is not None
        endpoint = res.endpoint_near(self.resolver.me.zone)
        if not forward or not endpoint:
            raise Refused(Status.NOT_JOURNAL_BROKER,
                          f"this broker serves no replica of {routed.journal}", res)
        return endpoint

    @property
    def forwarding(self) -> Channels:
        """The channels requests are forwarded over (only a broker in a cluster has)."""
        assert self.channels is not None, "a lone broker forwards nothing"
        return self.channels
