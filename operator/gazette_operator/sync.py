"""What the operator does with a resource, apart from Kubernetes: turn a `JournalSpec` or
`ShardSpec` resource into the spec it declares (validated by `gazette.protocol`, errors
naming the resource's field) and the key it names, write it into etcd for its resource
(`gazette_operator.ownership`: one owner per spec, guarded transactions), say why no
registered broker could serve a journal's stores, and read a journal's or shard's route
from its assignments and a shard's state from its replicas' statuses.

The kopf handlers are thin shells over this, so all of it is tested against a real etcd.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from gazette import names
from gazette.allocator import Route, assignments_of, route_of
from gazette.errors import ValidationError
from gazette.keyspace import (
    BROKER_ROOT,
    CONSUMER_ROOT,
    Decoder,
    Etcd,
    KeySpace,
    Layout,
    encode_item,
)
from gazette.protocol import JournalSpec, MemberSpec, ReplicaStatus, ShardSpec, combined_status
from gazette_operator.ownership import OPERATOR_ROOT, Owner, Records, Written

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


def declared_key(kind: str, spec: Any, broker_root: str = BROKER_ROOT,
                 consumer_root: str = CONSUMER_ROOT) -> str | None:
    """The etcd key a resource's ``spec`` names, from its name (a journal) or app and id
    (a shard) alone, so that it is known even when another field is invalid; None if
    those are invalid too."""
    if not isinstance(spec, dict):
        return None
    try:
        if kind == JOURNAL_KIND:
            return Layout.brokers(broker_root).item_key(
                names.validate_journal_name(spec.get("name")))
        if kind == SHARD_KIND:
            app = spec.get("app")
            if not isinstance(app, str):
                return None
            return Layout.consumer_app(app, consumer_root).item_key(
                names.validate_shard_id(spec.get("id")))
    except ValidationError:
        return None
    return None


def unserved(stores: tuple[str, ...], brokers: list[MemberSpec]) -> str | None:
    """Why none of the registered `brokers` can serve a journal of `stores` (None if one
    can, or if no broker is registered: then nothing is known yet)."""
    if not brokers or any(b.serves_stores(stores) for b in brokers):
        return None
    schemes = sorted({url.partition(":")[0] for url in stores})
    served = sorted({s for b in brokers for s in b.store_schemes})
    missing = [s for s in schemes if s not in served]
    what = (", ".join(f"{s}://" for s in missing) if missing else
            "all of " + ", ".join(f"{s}://" for s in schemes) + " at once")
    count = f"{len(brokers)} registered broker" + ("s serve" if len(brokers) > 1 else " serves")
    return (f"no broker serves {what} stores (the {count} "
            f"{', '.join(f'{s}://' for s in served)}); not written until one does")


class SpecWriter:
    """Writes declared specs into etcd for the resources that declare them, with
    `gazette_operator.ownership`'s records (one owner per spec, guarded writes and
    removals, tombstones against repairs after a delete)."""

    def __init__(self, etcd: Etcd, operator_root: str = OPERATOR_ROOT) -> None:
        self.etcd = etcd
        self.records = Records(etcd, operator_root)

    async def write(self, d: Declared, owner: Owner) -> Written:
        return await self.records.claim(d.key, d.value, owner)

    async def remove(self, owner: Owner, keys: Iterable[str], ttl: int) -> list[str]:
        return await self.records.release(owner, keys, ttl)

    async def brokers(self, layout: Layout) -> list[MemberSpec]:
        """The member specs of the brokers registered under `layout` (undecodable ones
        skipped)."""
        decode = Decoder(layout)
        found = []
        for kv in (await self.etcd.get_prefix(layout.members)).kvs:
            with contextlib.suppress(ValidationError, DecodeError):
                spec = decode(kv)
                if isinstance(spec, MemberSpec):
                    found.append(spec)
        return found


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
