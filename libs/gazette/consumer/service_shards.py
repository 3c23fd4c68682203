"""The Shard gRPC service of a consumer member.

- Stat: a shard's progress (offsets read through, as committed). With ``read_through``,
  it first waits until the shard has committed through those journal offsets, which
  gives read-your-writes: append, then Stat with the append's end, then query. Any
  member takes it and forwards it to the shard's primary (a request carrying a header
  was forwarded already, and is refused with NOT_SHARD_PRIMARY and the route instead).
- List: shard specs by selector (``id=``, ``prefix=``, labels), with their routes and
  each replica's status (as its member wrote it into etcd).
- Apply: shard specs upserted or deleted in one revision-guarded etcd transaction.
- GetHints: the shard's recovery-log hints, primary and backups, from etcd.
- Unassign: removes shards' assignments (all, or only those whose replica is FAILED),
  so the allocator assigns them anew.

Malformed requests fail with INVALID_ARGUMENT naming the field; the member keeps serving.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import grpc

from gazette import names
from gazette.allocator import Assignment, assignments_of, route_of
from gazette.auth import Capability, current_caller, require_scope
from gazette.cluster import Channels, Resolver, forward_unary, proxied
from gazette.consumer.recovery import load_hints
from gazette.consumer.shard import FAILED, LocalShard
from gazette.errors import ValidationError
from gazette.keyspace import Etcd, EtcdError, KeySpace, Layout, Txn, TxnConflict, apply_changes
from gazette.labels import EMPTY, shard_labels
from gazette.pb import consumer_pb2 as cpb
from gazette.pb import consumer_pb2_grpc
from gazette.protocol import (
    ShardSpec,
    SpecChange,
    selector_from_pb,
    shard_spec_from_pb,
    shard_spec_to_pb,
)

STAT_METHOD = "/gazette.consumer.Shard/Stat"
_SHARD = "/gazette.consumer.Shard/"
#: The capability each method needs; applications' own methods need SHARD_CALL.
SHARD_CAPABILITIES: dict[str, Capability | None] = {
    _SHARD + "Stat": Capability.SHARD_READ,
    _SHARD + "GetHints": Capability.SHARD_READ,
    _SHARD + "List": Capability.SHARD_LIST,
    _SHARD + "Apply": Capability.SHARD_APPLY,
    _SHARD + "Unassign": Capability.SHARD_APPLY,
}


async def authorize_shard(shard: str, spec: ShardSpec | None, context: Any) -> None:
    """Abort (PERMISSION_DENIED) unless the caller's token covers `shard` (by its labels;
    one without a spec by its id alone)."""
    if current_caller().claims.scoped:
        await require_scope(context, shard_labels(
            shard, spec.labels if spec is not None else EMPTY), f"shard {shard}")
#: How long a Stat waits for read-through offsets when its caller set no deadline.
READ_THROUGH_SECONDS = 60.0


class ShardServiceHost(Protocol):
    """What the Shard service needs of its member (a `ConsumerMember`): etcd, with the
    application's keyspace and layout in it, the routes of shards, channels to the
    other members, and the shards assigned to it."""

    @property
    def etcd(self) -> Etcd: ...

    @property
    def keyspace(self) -> KeySpace[Any]: ...

    @property
    def layout(self) -> Layout: ...

    @property
    def resolver(self) -> Resolver[ShardSpec]: ...

    @property
    def channels(self) -> Channels: ...

    def local_shard(self, shard: str) -> LocalShard | None:
        """`shard` if it is assigned to this member."""


class ShardService(consumer_pb2_grpc.ShardServicer):
    """The Shard service over `host`'s shards."""

    def __init__(self, host: ShardServiceHost) -> None:
        self.host = host

    async def _shard_id(self, shard: str, context: Any, field: str = "shard") -> str:
        try:
            return names.validate_shard_id(shard, field)
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            raise AssertionError("abort() raises") from None  # pragma: no cover

    def _spec(self, shard: str) -> ShardSpec | None:
        entry = self.host.keyspace.get(self.host.layout.items + shard)
        return entry.value if entry is not None and isinstance(entry.value, ShardSpec) \
            else None

    async def Stat(self, request: cpb.StatRequest, context: Any) -> cpb.StatResponse:
        shard = await self._shard_id(request.shard, context)
        for journal, offset in request.read_through.items():
            if offset < 0:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"read_through[{journal}]: must not be negative")
        resolver = self.host.resolver
        try:
            res = await resolver.resolve_at(
                shard, request.header if request.HasField("header") else None)
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        await authorize_shard(shard, res.spec, context)
        header = resolver.header(res)
        if res.spec is None:
            return cpb.StatResponse(status=cpb.SHARD_NOT_FOUND, header=header)
        local = self.host.local_shard(shard)
        runner = local.primary_runner if local is not None else None
        if runner is None:
            if request.HasField("header"):  # forwarded here already
                return cpb.StatResponse(status=cpb.NOT_SHARD_PRIMARY, header=header)
            if not res.primary_endpoint or res.route.primary_id == resolver.me:
                return cpb.StatResponse(status=cpb.NO_SHARD_PRIMARY, header=header)
            return await forward_unary(self.host.channels, res.primary_endpoint,
                                       STAT_METHOD, proxied(request, header),
                                       cpb.StatResponse.FromString, context,
                                       f"stat of shard {shard}")
        progress = runner.shard.progress
        remaining = context.time_remaining()
        try:
            async with asyncio.timeout(READ_THROUGH_SECONDS if remaining is None
                                       else remaining):
                await progress.wait_committed(dict(request.read_through))
        except TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                f"shard {shard} has not read through {dict(request.read_through)}"
                                f" yet (it is at {progress.committed})")
        if local is None or local.runner is not runner:
            return cpb.StatResponse(status=cpb.SHARD_STOPPED, header=header)
        return cpb.StatResponse(status=cpb.OK, header=header,
                                read_through=progress.committed)

    async def List(self, request: cpb.ListRequest, context: Any) -> cpb.ListResponse:
        try:
            selector = selector_from_pb(request.selector)
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        host = self.host
        out = []
        claims = current_caller().claims  # a token sees only the shards it covers
        for entry in host.keyspace.prefixed(host.layout.items):
            spec = entry.value
            if not isinstance(spec, ShardSpec):
                continue
            labels = shard_labels(spec.id, spec.labels)
            if not selector.matches(labels) or not claims.allows(labels):
                continue
            res = host.resolver.resolve(spec.id)
            status = [s.to_pb() for s in host.resolver.statuses(spec.id, res.route)]
            out.append(cpb.ListResponse.Shard(
                spec=shard_spec_to_pb(spec), mod_revision=entry.kv.mod_revision,
                create_revision=entry.kv.create_revision,
                route=res.route.with_endpoints(res.endpoints).to_pb(), status=status))
        return cpb.ListResponse(status=cpb.OK, header=host.resolver.header(), shards=out)

    async def Apply(self, request: cpb.ApplyRequest, context: Any) -> cpb.ApplyResponse:
        host = self.host
        changes: list[SpecChange[ShardSpec]] = []
        try:
            for i, change in enumerate(request.changes):
                kind = change.WhichOneof("change")
                if kind == "upsert":
                    try:
                        spec = shard_spec_from_pb(change.upsert)
                    except ValidationError as err:
                        raise err.within(f"changes[{i}].upsert") from None
                    changes.append(SpecChange(spec.id, change.expect_mod_revision, spec))
                elif kind == "delete":
                    names.validate_shard_id(change.delete, f"changes[{i}].delete")
                    changes.append(SpecChange(change.delete, change.expect_mod_revision, None))
                else:
                    raise ValidationError(f"changes[{i}]", "neither upsert nor delete")
            for item in changes:  # what it replaces or deletes, and what it writes
                await authorize_shard(item.name, self._spec(item.name), context)
                if item.spec is not None:
                    await authorize_shard(item.name, item.spec, context)
            revision = await apply_changes(host.etcd, host.layout, changes)
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except TxnConflict as err:
            header = host.resolver.header()
            header.etcd.revision = err.revision
            return cpb.ApplyResponse(status=cpb.ETCD_TRANSACTION_FAILED, header=header)
        header = host.resolver.header()
        header.etcd.revision = revision
        return cpb.ApplyResponse(status=cpb.OK, header=header)

    async def GetHints(self, request: cpb.GetHintsRequest, context: Any
                       ) -> cpb.GetHintsResponse:
        shard = await self._shard_id(request.shard, context)
        res = self.host.resolver.resolve(shard)
        await authorize_shard(shard, res.spec, context)
        header = self.host.resolver.header(res)
        if res.spec is None:
            return cpb.GetHintsResponse(status=cpb.SHARD_NOT_FOUND, header=header)
        try:
            loaded = await load_hints(self.host.etcd, res.spec)
        except EtcdError as err:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"reading hints of {shard}: "
                                f"{err}")
        found = [cpb.GetHintsResponse.ResponseHints(hints=h.to_pb() if h else None)
                 for _, h in loaded]
        return cpb.GetHintsResponse(status=cpb.OK, header=header,
                                    primary_hints=found[0] if found else None,
                                    backup_hints=found[1:])

    async def Unassign(self, request: cpb.UnassignRequest, context: Any
                       ) -> cpb.UnassignResponse:
        host = self.host
        shards = [await self._shard_id(s, context, "shards") for s in request.shards]
        for shard in shards:
            await authorize_shard(shard, self._spec(shard), context)
        chosen: dict[str, list[Assignment]] = {}
        for shard in shards:
            assigned = assignments_of(host.keyspace, host.layout, shard)
            if request.only_failed:
                route = route_of(assigned)
                failed = {m for m, s in zip(route.members,
                                            host.resolver.statuses(shard, route),
                                            strict=True) if s.state == FAILED}
                assigned = [a for a in assigned if a.member in failed]
            if assigned:
                chosen[shard] = assigned
        if not request.dry_run:
            for shard, assigned in chosen.items():
                for assignment in assigned:
                    txn = Txn().expect(assignment.key, assignment.mod_revision)
                    try:
                        await txn.delete(assignment.key).commit(host.etcd)
                    except TxnConflict:
                        pass  # it changed meanwhile: the allocator has moved it already
                    except EtcdError as err:
                        await context.abort(grpc.StatusCode.UNAVAILABLE,
                                            f"unassigning {shard}: {err}")
        return cpb.UnassignResponse(status=cpb.OK, shards=list(chosen))
