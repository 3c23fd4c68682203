"""`ShardClient`: the Shard service of a consumer member (listings of shards with their
routes and replica statuses, revision-guarded applies of shard specs, Stat, GetHints and
Unassign), over one gRPC channel.

Every call has a deadline (`timeout`) and rides out transport failures as the journal
client does (`RetryPolicy`); what is not retried becomes the library's errors, worded
for shards: `ShardUnavailable` (an `Unavailable`), `ShardApplyConflict` (an
`ApplyConflict`), `ShardError` for a refusal with a `Status`, and `ValidationError`
naming the field a member refused.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self, TypeVar

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from gazette import names
from gazette.auth import ClientAuth
from gazette.client.connection import Connection, _check_offset, _selector
from gazette.client.errors import ApplyConflict, BrokerError, Unavailable
from gazette.client.retry import Backoff, RetryPolicy
from gazette.client.specs import Applied
from gazette.errors import GazetteError, ValidationError
from gazette.labels import LabelSet, Selector
from gazette.pb import consumer_pb2 as cpb
from gazette.pb import consumer_pb2_grpc
from gazette.pb import recoverylog_pb2 as rpb
from gazette.protocol import (
    ReplicaStatus,
    Route,
    ShardSpec,
    combined_status,
    route_from_pb,
    selector_to_pb,
    shard_spec_from_pb,
    shard_spec_to_pb,
)
from gazette.protocol.status import ShardStatus
from gazette.protocol.trees import SpecChange

log = logging.getLogger(__name__)

#: A `stat` waiting to read through asks a shard without a primary again after this
#: long at first (doubling up to a second).
STAT_RETRY_SECONDS = 0.1

Response = TypeVar("Response", bound=Message)


class ShardError(GazetteError):
    """A consumer member refused a request: `status` is the protocol's `ShardStatus`
    such as `ShardStatus.SHARD_NOT_FOUND` (or, for a failure that is not a status, the
    gRPC code name)."""

    def __init__(self, status: ShardStatus | str, shard: str = "", detail: str = ""
                 ) -> None:
        self.status, self.shard, self.detail = status, shard, detail
        where = f" for shard {shard}" if shard else ""
        super().__init__(f"{status}{where}" + (f": {detail}" if detail else ""))

    @property
    def retriable(self) -> bool:  # type: ignore[override]
        return isinstance(self.status, ShardStatus) and self.status.retriable


class ShardApplyConflict(ApplyConflict):
    """An Apply of shard specs whose expected mod revision was stale: nothing was
    applied. Caught as `ApplyConflict`, so spec-apply flows treat both kinds alike."""

    def __init__(self, revision: int, shards: Sequence[str] = ()) -> None:
        super().__init__(revision, shards)
        self.shards = tuple(shards)
        self.args = (f"ETCD_TRANSACTION_FAILED for shard {', '.join(shards)}: a spec "
                     f"changed since it was read (etcd is at revision {revision}); "
                     "nothing was applied",)


class ShardUnavailable(Unavailable):
    """The consumer member could not be reached, or kept failing, after every retry.
    Caught as `Unavailable`; says "consumer member" where that says "broker"."""

    def __init__(self, op: str, address: str, code: str, detail: str, shard: str = "",
                 attempts: int = 1) -> None:
        super().__init__(op, address, code, detail, shard, attempts)
        self.shard = shard
        what = f"{op} of shard {shard}" if shard else op
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        self.args = (f"{what} via consumer member {address} failed{tries}: {code}: "
                     f"{detail}",)


@dataclass(frozen=True)
class ListedShard:
    """A shard of a listing: its spec, the etcd revisions it was created and last
    modified at (pass `mod_revision` to `apply` to change it), its route (with the
    members' endpoints; empty while unassigned) and its replicas' `statuses`,
    index-aligned with ``route.members`` (empty if the member did not report them)."""

    spec: ShardSpec
    mod_revision: int
    create_revision: int
    route: Route
    statuses: tuple[ReplicaStatus, ...] = ()

    @property
    def status(self) -> ReplicaStatus | None:
        """The replicas' combined status (the most advanced: `combined_status`); None
        without replicas."""
        return combined_status(self.statuses) if self.statuses else None


@dataclass(frozen=True)
class ShardStat:
    """A shard's progress as of its latest committed transaction: offsets of its source
    journals it has read through and of journals it has published through, and the
    route of the primary that answered."""

    read_through: dict[str, int]
    publish_at: dict[str, int]
    route: Route


@dataclass(frozen=True)
class ShardHints:
    """The recovery-log hints of a shard: its primary's latest (None if none were
    stored) and older backups, newest first. Empty until the shard has recovered from its
    recovery log once."""

    shard: str
    primary: rpb.FSMHints | None = None
    backups: tuple[rpb.FSMHints | None, ...] = field(default=())

    @property
    def empty(self) -> bool:
        return self.primary is None and all(b is None for b in self.backups)

    def to_dict(self) -> dict[str, Any]:
        """As JSON or YAML show it (protobuf's JSON mapping, field names as in the proto)."""
        def one(hints: rpb.FSMHints | None) -> dict[str, Any] | None:
            return None if hints is None else json_format.MessageToDict(
                hints, preserving_proto_field_name=True)
        return {"shard": self.shard, "primary_hints": one(self.primary),
                "backup_hints": [one(b) for b in self.backups]}


def _hints(msg: cpb.GetHintsResponse.ResponseHints) -> rpb.FSMHints | None:
    return msg.hints if msg.HasField("hints") else None


class ShardClient:
    """A client of one consumer member (``async with ShardClient("localhost:8090") as
    c``); any member of an application serves every call (Stat is forwarded to the
    shard's primary). `address` is as a `JournalClient`'s; `timeout` bounds each call;
    `retry` governs retries of transport failures."""

    def __init__(self, address: str, *, retry: RetryPolicy | None = None,
                 timeout: float = 30.0, channel_options: Sequence[tuple[str, Any]] = (),
                 auth: ClientAuth | None = None) -> None:
        self._connection = Connection(address, retry=retry, timeout=timeout,
                                      channel_options=channel_options, auth=auth)
        self._stub = consumer_pb2_grpc.ShardStub(self._connection.channel)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.address!r})"

    @property
    def address(self) -> str:
        """The member's gRPC target."""
        return self._connection.address

    @property
    def retry(self) -> RetryPolicy:
        return self._connection.retry

    @property
    def timeout(self) -> float:
        return self._connection.timeout

    @property
    def auth(self) -> ClientAuth:
        """TLS and the bearer token every call presents."""
        return self._connection.auth

    async def close(self) -> None:
        """Close the channel: calls made afterwards raise `ShardUnavailable` (CLOSED)."""
        await self._connection.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, op: str, shard: str,
                    rpc: Callable[..., Awaitable[Response]], request: Message,
                    timeout: float | None = None) -> tuple[Response, int]:
        """`rpc(request)` under a deadline, retried as `retry` allows; the response and
        how many attempts it took."""
        connection = self._connection
        backoff = Backoff(self.retry, op, self.address, shard, lambda: connection.closed)
        while True:
            if connection.closed:
                raise ShardUnavailable(op, self.address, "CLOSED", "the client was closed",
                                       shard)
            try:
                resp = await rpc(request, timeout=timeout or self.timeout)
                return resp, backoff.attempts
            except grpc.aio.AioRpcError as err:
                try:
                    await backoff.wait(err)
                except Unavailable:
                    raise ShardUnavailable(op, self.address, err.code().name,
                                           err.details() or "", shard,
                                           backoff.attempts) from err
                except BrokerError as exc:  # not retryable, and not INVALID_ARGUMENT
                    raise ShardError(exc.status, shard, exc.detail) from err

    async def list(self, selector: Selector | str = "") -> builtins.list[ListedShard]:
        """Shards whose labels match `selector` (all with an empty one), sorted by ID.
        A shard's ID is its implicit ``id`` label (and ``prefix``), e.g.
        ``"id=acme/part-000"`` or ``"prefix=acme/"``."""
        request = cpb.ListRequest(selector=selector_to_pb(_selector(selector)))
        resp, _ = await self._call("list", "", self._stub.List, request)
        if resp.status != cpb.OK:
            raise ShardError(ShardStatus.of(resp.status), "", "listing shards")
        out = [_listed(s, f"shards[{i}]") for i, s in enumerate(resp.shards)]
        out.sort(key=lambda s: s.spec.id)
        return out

    async def apply(self, changes: Sequence[SpecChange[ShardSpec]]) -> Applied:
        """Apply `changes` (upserts, and deletes where `spec` is None) in one etcd
        transaction, each only if its shard is still at its expected mod `revision` (0:
        must not exist). `ShardApplyConflict` if any revision is stale (nothing
        changed), `ValidationError` naming the field the member refused."""
        request = cpb.ApplyRequest()
        for i, change in enumerate(changes):
            if not isinstance(change, SpecChange):
                raise ValidationError(f"changes[{i}]", "expected a SpecChange")
            item = request.changes.add(expect_mod_revision=change.revision)
            if change.spec is None:
                item.delete = change.name
            elif isinstance(change.spec, ShardSpec):
                item.upsert.CopyFrom(shard_spec_to_pb(change.spec))
            else:
                raise ValidationError(f"changes[{i}].spec", "expected a ShardSpec, got "
                                      f"{type(change.spec).__name__}")
        resp, attempts = await self._call("apply", "", self._stub.Apply, request)
        ids = [c.name for c in changes]
        if resp.status == cpb.ETCD_TRANSACTION_FAILED:
            # An earlier attempt whose answer was lost may have applied them.
            if attempts > 1 and (revision := await self._applied(changes)):
                return Applied(revision)
            raise ShardApplyConflict(resp.header.etcd.revision, ids)
        if resp.status != cpb.OK:
            raise ShardError(ShardStatus.of(resp.status), ", ".join(ids))
        return Applied(int(resp.header.etcd.revision))

    async def _applied(self, changes: Sequence[SpecChange[ShardSpec]]) -> int:
        """The mod revision the shards are at if they are exactly as `changes` make them
        (all upserts at one revision, deletes gone); else 0."""
        wanted = Selector(LabelSet([("id", c.name) for c in changes]))
        found = {s.spec.id: s for s in await self.list(wanted)}
        revisions = set()
        for change in changes:
            got = found.get(change.name)
            if (got is None) != (change.spec is None) or (
                    got is not None and got.spec != change.spec):
                return 0
            if got is not None:
                revisions.add(got.mod_revision)
        if len(revisions) != 1:
            return 0
        log.info("apply: an attempt whose answer was lost had applied the changes")
        return revisions.pop()

    async def stat(self, shard: str, read_through: Mapping[str, int] | None = None, *,
                   timeout: float | None = None) -> ShardStat:
        """The shard's progress, from its primary (any member forwards it there). With
        `read_through` (journal -> offset), first waits until the shard has committed
        through those offsets, up to `timeout` (default: the client's)."""
        names.validate_shard_id(shard, "shard")
        offsets = {}
        for journal, offset in (read_through or {}).items():
            names.validate_journal_name(journal, "read_through")
            offsets[journal] = _check_offset(offset, f"read_through[{journal}]", 0)
        request = cpb.StatRequest(shard=shard, read_through=offsets)
        deadline = time.monotonic() + (timeout or self.timeout)
        delay = STAT_RETRY_SECONDS
        while True:
            resp, _ = await self._call("stat", shard, self._stub.Stat, request,
                                       max(deadline - time.monotonic(), 0.001))
            status = ShardStatus.of(resp.status)
            if status is ShardStatus.OK:
                break
            # Waiting to read through: a shard whose primary is changing (or not yet
            # assigned) is asked again until the deadline.
            if not (offsets and status.retriable) or time.monotonic() + delay > deadline:
                raise ShardError(status, shard)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        route = route_from_pb(resp.header.route, "header.route") \
            if resp.header.HasField("route") else Route()
        return ShardStat(dict(resp.read_through), dict(resp.publish_at), route)

    async def get_hints(self, shard: str) -> ShardHints:
        """The shard's recovery-log hints (`ShardHints.empty` if it has none yet);
        `ShardError` SHARD_NOT_FOUND if there is no such shard."""
        names.validate_shard_id(shard, "shard")
        resp, _ = await self._call("get_hints", shard, self._stub.GetHints,
                                   cpb.GetHintsRequest(shard=shard))
        if resp.status != cpb.OK:
            raise ShardError(ShardStatus.of(resp.status), shard)
        primary = _hints(resp.primary_hints) if resp.HasField("primary_hints") else None
        return ShardHints(shard, primary, tuple(_hints(b) for b in resp.backup_hints))

    async def unassign(self, shards: Sequence[str], only_failed: bool = False,
                       dry_run: bool = False) -> builtins.list[str]:
        """Remove the shards' assignments (only those of FAILED replicas with
        `only_failed`) so the allocator assigns them anew; the shards that were (with
        `dry_run`: would be) unassigned. A retry after a lost answer may unassign a
        shard again (it then restarts once more, which is harmless)."""
        if isinstance(shards, str):
            raise ValidationError("shards", "expected a list of shard IDs, got a str")
        for i, shard in enumerate(shards):
            names.validate_shard_id(shard, f"shards[{i}]")
        request = cpb.UnassignRequest(shards=list(shards), only_failed=only_failed,
                                      dry_run=dry_run)
        resp, _ = await self._call("unassign", "", self._stub.Unassign, request)
        if resp.status != cpb.OK:
            raise ShardError(ShardStatus.of(resp.status), ", ".join(shards))
        return list(resp.shards)


def _listed(msg: cpb.ListResponse.Shard, where: str) -> ListedShard:
    """A listed shard from the wire; `ValidationError` naming the field if malformed."""
    try:
        spec = shard_spec_from_pb(msg.spec)
    except ValidationError as err:
        raise err.within(f"{where}.spec") from None
    route = route_from_pb(msg.route, f"{where}.route") if msg.HasField("route") else Route()
    try:
        statuses = tuple(ReplicaStatus.from_pb(s) for s in msg.status)
    except ValidationError as err:
        raise err.within(where) from None
    if statuses and len(statuses) != len(route.members):
        raise ValidationError(f"{where}.status", f"{len(statuses)} statuses for "
                              f"{len(route.members)} route members")
    return ListedShard(spec, msg.mod_revision, msg.create_revision, route, statuses)
