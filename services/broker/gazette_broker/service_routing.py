"""Where a request's journal is served, for every RPC of the Journal service: the
replica here (if any), the journal's resolution in a cluster (after catching up with the
revision the request's header pins), and the response header that says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import grpc

from gazette import names
from gazette.auth import current_caller, require_scope
from gazette.cluster import (
    Channels,
    Resolution,
    Resolver,
)
from gazette.errors import ValidationError
from gazette.keyspace import Etcd, KeySpace, Layout
from gazette.labels import EMPTY, journal_labels
from gazette.pb import broker_pb2 as pb
from gazette.protocol import (
    JournalSpec,
    MemberSpec,
)
from gazette_broker.replica import Replica

log = logging.getLogger(__name__)

#: How long a request for a journal assigned here waits for its replica to open.
OPEN_WAIT_SECONDS = 5.0


class JournalRouting:
    """The state every RPC of `JournalService` shares, and how a request's journal is
    resolved: `replicas` served here; with `etcd`, `keyspace` and `layout`, Apply and
    List work. `member` names this broker in response headers. With `resolver` (a broker
    in a cluster), requests are routed by the journal's assignments and forwarded over
    `channels`; `wait_serving` waits until this broker has opened given journals."""

    def __init__(self, replicas: Mapping[str, Replica], etcd: Etcd | None = None,
                 keyspace: KeySpace[Any] | None = None, layout: Layout | None = None,
                 member: MemberSpec | None = None,
                 unready: Mapping[str, str] | None = None,
                 resolver: Resolver[JournalSpec] | None = None, channels: Channels | None = None,
                 wait_serving: Any = None) -> None:
        self.replicas = replicas
        #: Journals with a spec that cannot be served yet, and why (UNAVAILABLE).
        self.unready: Mapping[str, str] = unready if unready is not None else {}
        self.etcd, self.keyspace, self.layout = etcd, keyspace, layout
        self.member = member
        self.resolver, self.channels = resolver, channels
        self._wait_serving = wait_serving
        self._route = pb.Route(primary=-1)
        self._process_id = pb.ProcessSpec.ID()
        if member is not None:
            self._process_id = pb.ProcessSpec.ID(zone=member.id.zone, suffix=member.id.suffix)
            self._route = pb.Route(members=[self._process_id], primary=0,
                                   endpoints=[member.endpoint])

    def _header(self, revision: int | None = None, res: Resolution[JournalSpec] | None = None
                ) -> pb.Header:
        if self.resolver is not None:
            header = self.resolver.header(res)
            if revision is not None:  # e.g. an Apply's own revision
                header.etcd.revision = revision
            return header
        if revision is None:
            revision = self.keyspace.revision if self.keyspace is not None else 0
        return pb.Header(process_id=self._process_id, route=self._route,
                         etcd=pb.Header.Etcd(revision=revision))

    async def _replica(self, journal: str, context: Any) -> Replica | None:
        """The replica of `journal` here (None: no such journal); aborts on a bad name
        or a journal that cannot be served yet."""
        try:
            names.validate_journal_name(journal, "journal")
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        replica = self.replicas.get(journal)
        if replica is None and journal in self.unready:
            await context.abort(grpc.StatusCode.UNAVAILABLE, self.unready[journal])
        return replica

    async def _resolve(self, journal: str, header: pb.Header | None, context: Any
                       ) -> tuple[Resolution[JournalSpec] | None, Replica | None]:
        """(Where `journal` is served, its replica here): the resolution is None for a
        lone broker (no cluster). A journal assigned here whose replica is still being
        opened is waited for (briefly)."""
        replica = await self._replica(journal, context)
        if self.resolver is None:
            await self._authorize(journal, replica.spec if replica is not None else None,
                                  context)
            return None, replica
        try:
            res = await self.resolver.resolve_at(journal, header)
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        await self._authorize(journal, res.spec, context)
        if replica is None and self.resolver.me in res.route.members and \
                self._wait_serving is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(OPEN_WAIT_SECONDS):
                    await self._wait_serving({journal})
            replica = await self._replica(journal, context)
            if replica is None and res.spec is not None and self.resolver.is_assigned(journal):
                await context.abort(grpc.StatusCode.UNAVAILABLE,
                                    f"journal {journal} is assigned to this broker and still "
                                    "being opened (its fragment stores are listed first); "
                                    "retry")
        return res, replica

    @staticmethod
    async def _authorize(journal: str, spec: JournalSpec | None, context: Any) -> None:
        """Abort (PERMISSION_DENIED) unless the caller's token covers `journal` (by its
        labels; one without a spec by its name alone)."""
        if current_caller().claims.scoped:
            await require_scope(context, journal_labels(
                journal, spec.labels if spec is not None else EMPTY), f"journal {journal}")

    @property
    def _forwarding(self) -> Channels:
        """The channels requests are forwarded over (only a broker in a cluster has)."""
        assert self.channels is not None, "a lone broker forwards nothing"
        return self.channels

    def _reader_endpoint(self, res: Resolution[JournalSpec]) -> str:
        """A replica to forward a read to: one in this broker's zone if any."""
        assert self.resolver is not None
        return res.endpoint_near(self.resolver.me.zone)
