"""The specs part of a `JournalClient`: listings, watches, applies of spec changes, and
fragment listings."""

from __future__ import annotations

import builtins
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import timedelta

import grpc

from gazette import names
from gazette.client.connection import Connection, _check_offset, _ended_early, _selector
from gazette.client.errors import ApplyConflict, BrokerError
from gazette.errors import ValidationError
from gazette.fragment import Fragment, fragment_from_pb
from gazette.labels import LabelSet, Selector
from gazette.pb import broker_pb2 as pb
from gazette.pb import broker_pb2_grpc
from gazette.protocol import (
    JournalSpec,
    Route,
    journal_spec_from_pb,
    journal_spec_to_pb,
    route_from_pb,
    selector_to_pb,
)
from gazette.protocol.convert import duration_to_pb
from gazette.protocol.status import Status
from gazette.protocol.trees import SpecChange

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Applied:
    """An applied change of specs: etcd's `revision` after it, and `warnings` about
    specs that are likely not what their author meant (one sentence each)."""

    revision: int
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class ListedJournal:
    """A journal of a listing: its spec, the etcd revisions it was created and last
    modified at (pass `mod_revision` to `apply` to change it), and its route (empty
    while no broker serves it)."""

    spec: JournalSpec
    mod_revision: int
    create_revision: int
    route: Route


@dataclass(frozen=True)
class Listing:
    """The journals matching a selector (sorted by name) as of etcd `revision`."""

    revision: int
    journals: list[ListedJournal]


@dataclass(frozen=True)
class FragmentInfo:
    """A fragment of a journal and, if requested and it is persisted, a signed URL to
    fetch it from its store (`fetch_fragment`); for a closed fragment not persisted
    yet, why its last upload failed (`persist_error`, "" if it did not)."""

    fragment: Fragment
    signed_url: str
    persist_error: str = ""


class Specs:
    """`list`, `watch`, `apply`, `fragments` and `list_fragments` over a `Connection`."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._stub = broker_pb2_grpc.JournalStub(connection.channel)

    async def list(self, selector: Selector | str = "") -> Listing:
        """Journals whose labels match `selector` (all with an empty one), e.g.
        ``"prefix=foobar/, name not in (foobar/part-001)"``."""
        request = pb.ListRequest(selector=selector_to_pb(_selector(selector)))
        backoff = self._connection.backoff("list")
        while True:
            call = self._stub.List(request, timeout=self._connection.timeout)
            try:
                async for resp in call:
                    return _listing(resp)
                raise _ended_early("")
            except grpc.aio.AioRpcError as err:
                await backoff.wait(err)
            finally:
                call.cancel()

    async def watch(self, selector: Selector | str = "") -> AsyncIterator[Listing]:
        """A `Listing` of the journals matching `selector` now, and a fresh one after
        every change; reconnects after transport failures (a listing already yielded is
        not yielded again). Runs until closed (`contextlib.aclosing`)."""
        request = pb.ListRequest(selector=selector_to_pb(_selector(selector)), watch=True)
        backoff = self._connection.backoff("watch")
        last = 0
        while True:
            request.watch_resume_revision = last
            call = self._stub.List(request)
            try:
                async for resp in call:
                    listing = _listing(resp)
                    backoff.reset()
                    if listing.revision == last:
                        continue
                    last = listing.revision
                    yield listing
                raise _ended_early("")
            except grpc.aio.AioRpcError as err:
                await backoff.wait(err)
            finally:
                call.cancel()

    async def apply(self, changes: Sequence[SpecChange[JournalSpec]]) -> Applied:
        """Apply `changes` (upserts, and deletes where `spec` is None) in one etcd
        transaction, each only if its journal is still at its expected mod `revision`
        (0: must not exist). Returns the transaction's revision and the broker's warnings
        about the specs (likely mistakes, applied all the same). Raises `ApplyConflict`
        if any revision is stale (nothing changed) and `ValidationError` naming the field
        the broker refused."""
        request = pb.ApplyRequest()
        for i, change in enumerate(changes):
            if not isinstance(change, SpecChange):
                raise ValidationError(f"changes[{i}]", "expected a SpecChange")
            item = request.changes.add(expect_mod_revision=change.revision)
            if change.spec is None:
                item.delete = change.name
            else:
                item.upsert.CopyFrom(journal_spec_to_pb(change.spec))
        backoff = self._connection.backoff("apply")
        lost = False  # an attempt's answer was lost: it may have applied
        while True:
            try:
                resp = await self._stub.Apply(request, timeout=self._connection.timeout)
            except grpc.aio.AioRpcError as err:
                lost = True
                await backoff.wait(err)
                continue
            names_ = [c.name for c in changes]
            if resp.status == pb.ETCD_TRANSACTION_FAILED:
                if lost:
                    applied = await self._applied(changes)
                    if applied:
                        return Applied(applied)
                raise ApplyConflict(resp.header.etcd.revision, names_)
            if resp.status != pb.OK:
                raise BrokerError(Status.of(resp.status), ", ".join(names_))
            return Applied(int(resp.header.etcd.revision), tuple(resp.warnings))

    async def _applied(self, changes: Sequence[SpecChange[JournalSpec]]) -> int:
        """After a lost answer and then a conflict: the revision our own earlier attempt
        applied at, if the journals now are exactly as the changes make them (all
        upserts at one mod revision, deletes gone); else 0."""
        wanted = Selector(LabelSet([("name", c.name) for c in changes]))
        listing = await self.list(wanted)
        found = {j.spec.name: j for j in listing.journals}
        revisions = set()
        for change in changes:
            got = found.get(change.name)
            if change.spec is None:
                if got is not None:
                    return 0
            elif got is None or got.spec != change.spec:
                return 0
            else:
                revisions.add(got.mod_revision)
        if len(revisions) > 1:
            return 0
        log.info("apply: an attempt whose answer was lost had applied the changes")
        return revisions.pop() if revisions else listing.revision

    # -- fragments -------------------------------------------------------------------

    async def fragments(self, journal: str, *, begin_mod_time: int = 0,
                        end_mod_time: int = 0, signature_ttl: timedelta | None = None,
                        page_limit: int = 0) -> AsyncIterator[builtins.list[FragmentInfo]]:
        """The journal's fragments in offset order, a page (of up to `page_limit`, 0:
        the broker's default) at a time. `begin_mod_time`/`end_mod_time` (Unix seconds)
        keep fragments persisted in that window; `signature_ttl` asks for signed URLs
        of persisted fragments."""
        names.validate_journal_name(journal, "journal")
        _check_offset(begin_mod_time, "begin_mod_time", 0)
        _check_offset(end_mod_time, "end_mod_time", 0)
        _check_offset(page_limit, "page_limit", 0, 2**31 - 1)  # an int32
        request = pb.FragmentsRequest(journal=journal, begin_mod_time=begin_mod_time,
                                      end_mod_time=end_mod_time, page_limit=page_limit)
        if signature_ttl:
            if signature_ttl < timedelta(0):
                raise ValidationError("signature_ttl", "must not be negative")
            request.signature_ttl.CopyFrom(duration_to_pb(signature_ttl))
        while True:
            backoff = self._connection.backoff("fragments", journal)
            while True:
                try:
                    resp = await self._stub.ListFragments(request, timeout=self._connection.timeout)
                    break
                except grpc.aio.AioRpcError as err:
                    await backoff.wait(err)
            if resp.status != pb.OK:
                raise BrokerError(Status.of(resp.status), journal, "listing fragments")
            yield [FragmentInfo(fragment_from_pb(item.spec, f"fragments[{i}]"),
                                item.signed_url, item.persist_error)
                   for i, item in enumerate(resp.fragments)]
            if not resp.next_page_token:
                return
            request.next_page_token = resp.next_page_token

    async def list_fragments(self, journal: str, *, begin_mod_time: int = 0,
                             end_mod_time: int = 0, signature_ttl: timedelta | None = None,
                             page_limit: int = 0) -> builtins.list[FragmentInfo]:
        """Every fragment of the journal (all pages of `fragments`)."""
        out: builtins.list[FragmentInfo] = []
        async for page in self.fragments(journal, begin_mod_time=begin_mod_time,
                                         end_mod_time=end_mod_time,
                                         signature_ttl=signature_ttl, page_limit=page_limit):
            out.extend(page)
        return out


def _listing(resp: pb.ListResponse) -> Listing:
    if resp.status != pb.OK:
        raise BrokerError(Status.of(resp.status), "", "listing journals")
    journals = [ListedJournal(journal_spec_from_pb(j.spec), j.mod_revision, j.create_revision,
                              route_from_pb(j.route) if j.HasField("route") else Route())
                for j in resp.journals]
    journals.sort(key=lambda j: j.spec.name)
    return Listing(resp.header.etcd.revision, journals)
