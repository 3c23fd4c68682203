"""What the operator does with a resource, apart from Kubernetes: turn a `JournalSpec` or
`ShardSpec` resource into the spec it declares (validated by `gazette.protocol`, errors
naming the resource's field), write it into etcd in revision-guarded transactions,
notice drift (the etcd value changed or vanished outside Kubernetes) and restore it,
remove it, and read a journal's or shard's route from its assignments and a shard's
state from its replicas' statuses.

The kopf handlers are thin shells over this, so all of it is tested against a real etcd.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from gazette.allocator import Route, assignments_of, route_of
from gazette.errors import ValidationError
from gazette.keyspace import (
    BROKER_ROOT,
    CONSUMER_ROOT,
    Etcd,
    KeySpace,
    Layout,
    Txn,
    TxnConflict,
    encode_item,
)
from gazette.protocol import JournalSpec, ReplicaStatus, ShardSpec, combined_status

JOURNAL_KIND, SHARD_KIND = "JournalSpec", "ShardSpec"


@dataclass(frozen=True)
class Declared:
    """The spec a resource declares, where it goes in etcd, and its encoded value."""

    spec: JournalSpec | ShardSpec
    layout: Layout
    key: str
    value: bytes

    @property
    def name(self) -> str:
        return self.spec.name if isinstance(self.spec, JournalSpec) else self.spec.id


def declared(kind: str, spec: Any, broker_root: str = BROKER_ROOT,
             consumer_root: str = CONSUMER_ROOT) -> Declared:
    """The spec of a resource's ``spec``; `ValidationError` naming ``spec.<field>``
    when it is invalid (then nothing may be written)."""
    if not isinstance(spec, dict):
        raise ValidationError("spec", "expected an object")
    if kind == JOURNAL_KIND:
        journal = JournalSpec.from_dict(spec, "spec")
        layout = Layout.brokers(broker_root)
        return Declared(journal, layout, layout.item_key(journal.name), encode_item(journal))
    if kind == SHARD_KIND:
        fields = dict(spec)
        app = fields.pop("app", None)
        if not isinstance(app, str):
            raise ValidationError("spec.app", "the consumer application is required")
        try:
            layout = Layout.consumer_app(app, consumer_root)
        except ValidationError as err:
            raise err.within("spec") from None
        shard = ShardSpec.from_dict(fields, "spec")
        return Declared(shard, layout, layout.item_key(shard.id), encode_item(shard))
    raise ValidationError("kind", f"{kind!r} is neither {JOURNAL_KIND} nor {SHARD_KIND}")


class Conflict(Exception):
    """The key was changed in etcd by someone other than the operator."""

    def __init__(self, key: str, revision: int) -> None:
        self.key, self.revision = key, revision
        super().__init__(f"{key} was changed outside Kubernetes (mod revision {revision})")


@dataclass(frozen=True)
class Observed:
    """What etcd holds at a key: its value and mod revision (0 and b"" if absent)."""

    value: bytes
    mod_revision: int


class SpecWriter:
    """Writes declared specs into etcd; every write compares the key's mod revision."""

    def __init__(self, etcd: Etcd) -> None:
        self.etcd = etcd

    async def observe(self, key: str) -> Observed:
        _, kv = await self.etcd.get(key)
        return Observed(kv.value, kv.mod_revision) if kv is not None else Observed(b"", 0)

    async def write(self, d: Declared, written: int) -> int:
        """Put `d` if the key is absent or still at `written`, the mod revision the
        operator last wrote (0: never); returns the new mod revision (the current one if
        etcd already holds exactly `d`). `Conflict` if someone else changed the key."""
        now = await self.observe(d.key)
        if now.value == d.value and now.mod_revision:
            return now.mod_revision
        if now.mod_revision not in (0, written):
            raise Conflict(d.key, now.mod_revision)
        return await self._put(d, now.mod_revision)

    async def restore(self, d: Declared) -> tuple[bool, int]:
        """Make etcd hold `d` whatever is there now: (whether it had drifted, the mod
        revision it has after)."""
        now = await self.observe(d.key)
        if now.value == d.value and now.mod_revision:
            return False, now.mod_revision
        return True, await self._put(d, now.mod_revision)

    async def _put(self, d: Declared, expect: int) -> int:
        try:
            result = await Txn().expect(d.key, expect).put(d.key, d.value).commit(self.etcd)
        except TxnConflict as err:
            raise Conflict(d.key, err.stale[0][2] if err.stale else 0) from None
        return result.revision

    async def remove(self, key: str, written: int) -> bool:
        """Delete the key if it is still at `written` (or absent: nothing to do).
        Returns whether it was deleted; `Conflict` if someone else changed it since."""
        now = await self.observe(key)
        if not now.mod_revision:
            return False
        if written and now.mod_revision != written:
            raise Conflict(key, now.mod_revision)
        try:
            await Txn().expect(key, now.mod_revision).delete(key).commit(self.etcd)
        except TxnConflict as err:
            raise Conflict(key, err.stale[0][2] if err.stale else 0) from None
        return True


def journal_route(keyspace: KeySpace[Any], layout: Layout, journal: str
                  ) -> tuple[str, list[str]]:
    """(primary, replicas) of `journal` as ``zone/suffix`` names, from its assignments
    in a mirror of the broker cluster's keyspace ("" and [] while unassigned)."""
    return route_names(route_of(assignments_of(keyspace, layout, journal)))


def shard_state(values: Iterable[bytes]) -> str:
    """A shard's state from its replicas' encoded statuses: the most advanced one
    (``failed: <error>`` if any failed; ``pending`` if none); undecodable ones are
    skipped."""
    statuses = []
    for value in values:
        with contextlib.suppress(ValidationError, DecodeError):
            statuses.append(ReplicaStatus.decode(value))
    return str(combined_status(statuses))


def route_names(route: Route) -> tuple[str, list[str]]:
    """(primary, members) of `route` as ``zone/suffix`` names ("" without a primary)."""
    members = [f"{m.zone}/{m.suffix}" for m in route.members]
    return (members[route.primary] if route.primary >= 0 else ""), members
