"""The members page's model: brokers and consumer members as their member specs in etcd
say (zone, endpoint, limits), with the journals and shards assigned to each (slot 0 is
the primary) and, for shards, each replica's status. One read of each root, decoded
here without further I/O."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

from gazette.errors import ValidationError
from gazette.keyspace import Decoder, Etcd, KeyValue, Layout
from gazette.keyspace.layout import AssignmentKey, ItemKey, MemberKey, StatusKey
from gazette.protocol import MemberSpec, ReplicaStatus


@dataclass
class Assigned:
    """An item (journal or shard) assigned to a member: primary (slot 0) or not, and
    the replica's status where the member wrote one (shards)."""

    item: str
    slot: int
    status: ReplicaStatus | None = None

    @property
    def role(self) -> str:
        return "primary" if self.slot == 0 else "replica"


@dataclass
class MemberView:
    """A member: its spec and its assignments, sorted by item."""

    spec: MemberSpec
    assigned: list[Assigned] = field(default_factory=list)

    @property
    def primaries(self) -> int:
        return sum(1 for a in self.assigned if a.slot == 0)


@dataclass
class Group:
    """The members of the brokers (`name` "brokers") or of one consumer application,
    and how many items (journals or shards) it has."""

    name: str
    root: str
    members: list[MemberView]
    items: int
    problems: list[str] = field(default_factory=list)

    @property
    def zones(self) -> list[str]:
        return sorted({m.spec.id.zone for m in self.members})


def decode_group(name: str, layout: Layout, kvs: Sequence[KeyValue], *,
                 consumers: bool) -> Group:
    """The `Group` of the keys `kvs` under `layout` (keys of others are skipped; a value
    that does not decode is a problem named on the page, not an error)."""
    decode = Decoder(layout, consumers=consumers)
    members: dict[tuple[str, str], MemberView] = {}
    assigned: list[tuple[AssignmentKey, ReplicaStatus | None]] = []
    statuses: dict[tuple[str, str, str], ReplicaStatus] = {}
    items, problems = 0, []
    for kv in kvs:
        try:
            key = layout.parse(kv.key)
        except ValidationError:
            continue  # another application's, or no key of the layout
        try:
            value = decode(kv)
        except (ValidationError, DecodeError) as err:
            problems.append(f"{kv.key}: {err}")
            continue
        if isinstance(key, MemberKey) and isinstance(value, MemberSpec):
            members[(key.zone, key.suffix)] = MemberView(value)
        elif isinstance(key, AssignmentKey):
            assigned.append((key, None))
        elif isinstance(key, StatusKey) and isinstance(value, ReplicaStatus):
            statuses[(key.item, key.zone, key.suffix)] = value
        elif isinstance(key, ItemKey):
            items += 1
    for key, _ in assigned:
        member = members.get((key.zone, key.suffix))
        if member is None:
            problems.append(f"{key.item} is assigned to {key.zone}#{key.suffix}, which "
                            "has no member spec (its lease ran out)")
            continue
        member.assigned.append(Assigned(key.item, key.slot,
                                        statuses.get((key.item, key.zone, key.suffix))))
    for member in members.values():
        member.assigned.sort(key=lambda a: (a.item, a.slot))
    ordered = sorted(members.values(), key=lambda m: (m.spec.id.zone, m.spec.id.suffix))
    return Group(name, layout.root, ordered, items, problems)


def app_names(root: str, kvs: Sequence[KeyValue]) -> list[str]:
    """The consumer applications under `root` that have members or shards."""
    pattern = re.compile(re.escape(root.rstrip("/")) +
                         r"/(?P<app>[^#]+?)/(?:members/[^/#]+#[^/#]+$|items/)")
    found = set()
    for kv in kvs:
        match = pattern.match(kv.key)
        if match:
            with contextlib.suppress(ValidationError):
                Layout.consumer_app(match.group("app"), root)
                found.add(match.group("app"))
    return sorted(found)


async def read_groups(etcd: Etcd, broker_root: str, consumer_root: str) -> list[Group]:
    """The brokers' group, then each consumer application's (a ValidationError names a
    bad prefix)."""
    brokers = Layout.brokers(broker_root)
    kvs = (await etcd.get_prefix(brokers.root + "/")).kvs
    groups = [decode_group("brokers", brokers, kvs, consumers=False)]
    Layout.brokers(consumer_root)  # a bad prefix is named before it is read
    consumer_kvs = (await etcd.get_prefix(consumer_root.rstrip("/") + "/")).kvs
    for app in app_names(consumer_root, consumer_kvs):
        layout = Layout.consumer_app(app, consumer_root)
        mine = [kv for kv in consumer_kvs if kv.key.startswith(layout.root + "/")]
        groups.append(decode_group(app, layout, mine, consumers=True))
    return groups


def endpoint_of(group: Group) -> str:
    """A member endpoint of a consumer application to ask for its shards ("" if none):
    any member serves every call."""
    return group.members[0].spec.endpoint if group.members else ""
