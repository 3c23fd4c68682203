"""The kinds of spec a tree can hold: what names a node, what never leaves a leaf, and the
canonical key order so that written YAML reads the same way every time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TreeKind:
    """How one kind of spec (journals, shards) sits in a tree.

    The tree code is generic over kinds; only these few facts differ between them.
    """

    #: A short plural noun for messages ("journals").
    name: str
    #: The key naming a node: ``name`` for journals, ``id`` for shards.
    name_key: str
    #: Keys that belong to one leaf only and are never inherited nor hoisted: the name key
    #: and ``revision`` (the etcd mod revision an optimistic apply is checked against).
    leaf_only: frozenset[str]
    #: Canonical order of top-level keys on output; unknown keys follow, sorted.
    key_order: tuple[str, ...]
    #: Canonical order of keys inside nested mappings, by top-level key.
    nested_key_order: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: The key holding ``{name, value}`` labels, which merge as a set union.
    labels_key: str = "labels"
    #: The key holding a group's child nodes.
    children_key: str = "children"

    def nested_order(self, key: str) -> tuple[str, ...]:
        """Canonical key order inside the nested mapping at top-level `key` (may be empty)."""
        for nested_key, order in self.nested_key_order:
            if nested_key == key:
                return order
        return ()


JOURNALS = TreeKind(
    name="journals",
    name_key="name",
    leaf_only=frozenset({"name", "revision"}),
    key_order=(
        "name",
        "replication",
        "labels",
        "fragment",
        "flags",
        "max_append_rate",
        "suspend",
        "revision",
        "delete",
        "children",
    ),
    nested_key_order=(
        (
            "fragment",
            (
                "length",
                "compression_codec",
                "stores",
                "refresh_interval",
                "retention",
                "flush_interval",
                "path_postfix_template",
            ),
        ),
    ),
)

SHARDS = TreeKind(
    name="shards",
    name_key="id",
    leaf_only=frozenset({"id", "revision"}),
    key_order=(
        "id",
        "sources",
        "recovery_log_prefix",
        "hint_prefix",
        "hint_backups",
        "max_txn_duration",
        "min_txn_duration",
        "disable",
        "hot_standbys",
        "labels",
        "disable_wait_for_ack",
        "ring_buffer_size",
        "read_channel_size",
        "revision",
        "delete",
        "children",
    ),
)
