"""Where things live in etcd, under one root per cluster or consumer application.

- ``{root}/items/{id}``: a JournalSpec or ShardSpec;
- ``{root}/members/{zone}#{suffix}``: a member spec, under the member's lease;
- ``{root}/assign/{item}#{zone}#{suffix}#{slot}``: an assignment (slot 0 is primary),
  under its member's lease;
- ``{root}/status/{item}#{zone}#{suffix}``: the status of a member's replica of an item
  (consumer shards: `gazette.protocol.ReplicaStatus`), under that member's lease.

Names never contain ``#`` (see `gazette.names`), so keys split unambiguously.
"""

from __future__ import annotations

from dataclasses import dataclass

from gazette import names
from gazette.errors import ValidationError

BROKER_ROOT = "/gazette/cluster"
CONSUMER_ROOT = "/gazette/consumers"


@dataclass(frozen=True, slots=True)
class ItemKey:
    item: str


@dataclass(frozen=True, slots=True)
class MemberKey:
    zone: str
    suffix: str


@dataclass(frozen=True, slots=True)
class AssignmentKey:
    item: str
    zone: str
    suffix: str
    slot: int


@dataclass(frozen=True, slots=True)
class StatusKey:
    item: str
    zone: str
    suffix: str


@dataclass(frozen=True, slots=True)
class Layout:
    """The keys of one cluster (brokers) or one consumer application."""

    root: str

    def __post_init__(self) -> None:
        names.validate_etcd_prefix(self.root, "etcd.prefix")

    @classmethod
    def brokers(cls, root: str = BROKER_ROOT) -> Layout:
        return cls(root)

    @classmethod
    def consumer_app(cls, app: str, root: str = CONSUMER_ROOT) -> Layout:
        names.validate_path(app, "app", 1, 128)
        return cls(f"{root}/{app}")

    @property
    def items(self) -> str:
        return f"{self.root}/items/"

    @property
    def members(self) -> str:
        return f"{self.root}/members/"

    @property
    def assignments(self) -> str:
        return f"{self.root}/assign/"

    @property
    def statuses(self) -> str:
        return f"{self.root}/status/"

    def item_key(self, item: str) -> str:
        return self.items + item

    def member_key(self, zone: str, suffix: str) -> str:
        return f"{self.members}{zone}#{suffix}"

    def assignment_key(self, item: str, zone: str, suffix: str, slot: int) -> str:
        return f"{self.assignments}{item}#{zone}#{suffix}#{slot}"

    def status_key(self, item: str, zone: str, suffix: str) -> str:
        return f"{self.statuses}{item}#{zone}#{suffix}"

    def item_statuses(self, item: str) -> str:
        """The prefix of every replica status of `item`."""
        return f"{self.statuses}{item}#"

    def item_assignments(self, item: str) -> str:
        """The prefix of every assignment of `item`."""
        return f"{self.assignments}{item}#"

    def parse(self, key: str) -> ItemKey | MemberKey | AssignmentKey | StatusKey:
        """Which kind of key this is, and its parts (each checked, so that a parsed key
        always formats back to `key`)."""
        if not isinstance(key, str):
            raise ValidationError("key", f"expected a string, got {type(key).__name__}")
        try:
            if key.startswith(self.items) and len(key) > len(self.items):
                return ItemKey(_item(key[len(self.items):]))
            if key.startswith(self.members):
                parts = key[len(self.members):].split("#")
                if len(parts) == 2:
                    return MemberKey(_zone(parts[0]), _suffix(parts[1]))
            if key.startswith(self.assignments):
                parts = key[len(self.assignments):].split("#")
                if len(parts) == 4 and _is_slot(parts[3]):
                    return AssignmentKey(_item(parts[0]), _zone(parts[1]), _suffix(parts[2]),
                                         int(parts[3]))
            if key.startswith(self.statuses):
                parts = key[len(self.statuses):].split("#")
                if len(parts) == 3:
                    return StatusKey(_item(parts[0]), _zone(parts[1]), _suffix(parts[2]))
        except ValidationError as err:
            raise ValidationError("key", f"{key!r}: {err.reason}") from None
        raise ValidationError("key", f"{key!r} is not an item, member, assignment or status key "
                              f"under {self.root}")


# Parts of keys follow the rules of what they name (see `gazette.protocol.member_spec`,
# whose zone and suffix rules are repeated here to keep this module free of it).
_ZONE_SYMBOLS = "-_."


def _item(name: str) -> str:
    return names.validate_path(name, "item", names.MIN_SHARD_ID_LEN, names.MAX_JOURNAL_NAME_LEN)


def _zone(zone: str) -> str:
    return names.validate_token(zone, "zone", _ZONE_SYMBOLS, 1, 64)


def _suffix(suffix: str) -> str:
    return names.validate_token(suffix, "suffix", _ZONE_SYMBOLS, 1, 128)


def _is_slot(text: str) -> bool:
    """A slot in canonical decimal: ASCII digits (``str.isdigit`` also takes ``²``, which
    ``int`` rejects) without leading zeros."""
    return text.isascii() and text.isdigit() and (text == "0" or not text.startswith("0"))
