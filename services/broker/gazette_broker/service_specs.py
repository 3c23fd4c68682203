"""Apply and List: journal specs written to etcd in one guarded transaction (with
warnings about what is likely not meant), and listings (or watches) of them by selector.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from gazette import names
from gazette.auth import current_caller
from gazette.errors import ValidationError
from gazette.keyspace import Entry, Event, TxnConflict, apply_changes
from gazette.labels import Selector, journal_labels
from gazette.pb import broker_pb2 as pb
from gazette.protocol import (
    JournalSpec,
    MemberSpec,
    SpecChange,
    journal_spec_from_pb,
    journal_spec_to_pb,
    selector_from_pb,
)
from gazette_broker.routing import JournalRouting
from gazette_broker.service_routing import authorize

log = logging.getLogger(__name__)

class SpecRpcs:
    """The Apply and List RPCs over `routing`."""

    def __init__(self, routing: JournalRouting) -> None:
        self.routing = routing

    async def Apply(self, request: pb.ApplyRequest, context: Any) -> pb.ApplyResponse:
        etcd, layout = self.routing.etcd, self.routing.layout
        if etcd is None or layout is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this broker has no etcd")
        assert etcd is not None and layout is not None  # abort() raised otherwise
        changes: list[SpecChange[JournalSpec]] = []
        try:
            for i, change in enumerate(request.changes):
                if change.WhichOneof("change") == "upsert":
                    try:
                        spec = journal_spec_from_pb(change.upsert)
                    except ValidationError as err:
                        raise err.within(f"changes[{i}].upsert") from None
                    changes.append(SpecChange(spec.name, change.expect_mod_revision, spec))
                elif change.WhichOneof("change") == "delete":
                    names.validate_journal_name(change.delete, f"changes[{i}].delete")
                    changes.append(SpecChange(change.delete, change.expect_mod_revision, None))
                else:
                    raise ValidationError(f"changes[{i}]", "neither upsert nor delete")
            await self._authorize_changes(changes, context)
            revision = await apply_changes(etcd, layout, changes)
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except TxnConflict as err:
            return pb.ApplyResponse(status=pb.ETCD_TRANSACTION_FAILED,
                                    header=self.routing.header(err.revision))
        return pb.ApplyResponse(status=pb.OK, header=self.routing.header(revision),
                                warnings=self._warnings(changes))

    async def _authorize_changes(self, changes: list[SpecChange[JournalSpec]], context: Any
                                 ) -> None:
        """A scoped token may write only specs it covers, before and after: a journal
        it deletes or replaces, and the spec it writes."""
        if not current_caller().claims.scoped:
            return
        assert self.routing.keyspace is not None and self.routing.layout is not None
        for change in changes:
            entry = self.routing.keyspace.get(self.routing.layout.items + change.name)
            before = entry.value if entry is not None and isinstance(
                entry.value, JournalSpec) else None
            specs: list[JournalSpec | None] = [
                s for s in (before, change.spec) if s is not None]
            for spec in specs or [None]:
                await authorize(change.name, spec, context)

    def _warnings(self, changes: list[SpecChange[JournalSpec]]) -> list[str]:
        """What in applied specs is likely not what their author meant."""
        assert self.routing.keyspace is not None and self.routing.layout is not None
        brokers = [e.value for e in self.routing.keyspace.prefixed(self.routing.layout.members)
                   if isinstance(e.value, MemberSpec) and e.value.item_limit > 0]
        out = []
        for change in changes:
            spec = change.spec
            if spec is None:
                continue
            if self.routing.resolver is not None and spec.replication > len(brokers):
                out.append(f"{spec.name}: replication {spec.replication} is more than the "
                           f"{len(brokers)} broker(s) of the cluster: its appends are "
                           f"refused (INSUFFICIENT_JOURNAL_BROKERS) until there are "
                           f"{spec.replication}")
            if not spec.fragment.stores:
                out.append(f"{spec.name}: no fragment stores: its content is never "
                           "persisted, and is lost when its brokers stop (set "
                           "fragment.stores)")
            elif self.routing.resolver is not None and brokers and not any(
                    b.serves_stores(spec.fragment.stores) for b in brokers):
                kinds = sorted({k for b in brokers for k in b.store_schemes})
                out.append(f"{spec.name}: no broker can serve its stores "
                           f"{', '.join(spec.fragment.stores)} (the brokers serve "
                           f"{', '.join(kinds) or 'none'}; file:// needs "
                           "--broker.file-root): it is not assigned until one can")
        return out

    def _listing(self, selector: Any) -> pb.ListResponse:
        assert self.routing.keyspace is not None and self.routing.layout is not None
        journals = []
        claims = current_caller().claims  # a token sees only the journals it covers
        for entry in self._candidates(selector):
            spec = entry.value
            if not isinstance(spec, JournalSpec):
                continue
            labels = journal_labels(spec.name, spec.labels)
            if selector.matches(labels) and claims.allows(labels):
                route: pb.Route | None = None
                if self.routing.resolver is not None:
                    res = self.routing.resolver.resolve(spec.name)
                    route = res.route.with_endpoints(res.endpoints).to_pb()
                else:
                    route = self.routing.lone_route if spec.name in self.routing.replicas else None
                journals.append(pb.ListResponse.Journal(
                    spec=journal_spec_to_pb(spec), mod_revision=entry.kv.mod_revision,
                    create_revision=entry.kv.create_revision, route=route))
        return pb.ListResponse(status=pb.OK, journals=journals,
                               header=self.routing.header(self.routing.keyspace.revision))

    def _candidates(self, selector: Selector) -> list[Entry[Any]]:
        """The specs a selector may match: those it names (``name=``), or those under
        the prefixes it names (``prefix=``), else all; so that listing one journal does
        not cost a look at every one."""
        assert self.routing.keyspace is not None and self.routing.layout is not None
        items = self.routing.layout.items
        names_ = selector.include.values("name")
        if names_ and all(names_):
            found = (self.routing.keyspace.get(items + n) for n in sorted(set(names_)))
            return [e for e in found if e is not None]
        prefixes = selector.include.values("prefix")
        if prefixes and all(prefixes):
            seen: dict[str, Entry[Any]] = {}
            for prefix in prefixes:
                seen.update((e.kv.key, e) for e in self.routing.keyspace.prefixed(items + prefix))
            return [seen[k] for k in sorted(seen)]
        return self.routing.keyspace.prefixed(items)

    async def List(self, request: pb.ListRequest, context: Any
                   ) -> AsyncIterator[pb.ListResponse]:
        keyspace, layout = self.routing.keyspace, self.routing.layout
        if keyspace is None or layout is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this broker has no etcd")
        assert keyspace is not None and layout is not None  # abort() raised otherwise
        try:
            selector = selector_from_pb(request.selector)
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        if not request.watch:
            yield self._listing(selector)
            return
        resume = request.watch_resume_revision
        if resume < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"watch_resume_revision: must be >= 0, got {resume}")
        changed = asyncio.Event()  # coalesces bursts of changes into one listing

        def on_change(revision: int, events: list[Event]) -> None:
            if any(ev.kv.key.startswith(layout.items) for ev in events):
                changed.set()

        stop = keyspace.observe(on_change)
        try:
            # A client resuming at a revision it has seen gets nothing until a change.
            if not resume or keyspace.revision > resume:
                yield self._listing(selector)
            while True:
                await changed.wait()
                changed.clear()
                yield self._listing(selector)
        finally:
            stop()
