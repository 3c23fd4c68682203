"""Which resource owns which etcd spec, recorded in etcd beside the specs, so that two
resources naming one journal (or shard) never overwrite each other, a delete removes
only what its resource wrote, and a repair can never recreate what a delete removed.

Two records under the operator's prefix (``OPERATOR_ETCD_PREFIX``, by default the
broker prefix followed by ``-operator``: outside every cluster's and application's
keyspace, so no broker or consumer member reads them):

- ``{prefix}/items{key}``: the owner of the spec at ``key``, as ``{"resource":
  "<namespace>/<name>", "kind": ...}``. Another resource declaring that key is refused
  (`OwnedElsewhere`) until the owner is deleted.
- ``{prefix}/resources/<kind>/<namespace>/<name>``: the key that resource holds, its
  ``uid`` and the ``generation`` written. A resource renamed (a journal's name, a
  shard's app or id) has its old key removed in the transaction that writes the new
  one; a write from an older generation than the one recorded (a replica with a stale
  view) is refused (`Stale`). Deleting the resource replaces this record with a
  tombstone ``{"uid": ..., "deleted": true}`` under a lease, so a drift check still in
  flight (in this replica or another) cannot write the spec again (`Deleting`); a new
  resource of the same name has another uid and may.

Every write is one transaction comparing the mod revisions of the records and the spec
it read: a concurrent writer makes it fail (`Conflict`), never interleave.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gazette.errors import GazetteError
from gazette.keyspace import Etcd, Txn, TxnConflict

#: Root of the operator's records when none is given.
OPERATOR_ROOT = "/gazette/cluster-operator"


@dataclass(frozen=True)
class Owner:
    """A resource, as its records name it."""

    kind: str
    namespace: str
    name: str
    uid: str
    generation: int

    @property
    def resource(self) -> str:
        return f"{self.namespace}/{self.name}"


class Conflict(GazetteError):
    """Someone else wrote a compared key between our read and our write."""


class OwnedElsewhere(GazetteError):
    """The spec's key belongs to another resource."""

    def __init__(self, key: str, owner: str) -> None:
        self.key, self.owner = key, owner
        super().__init__(f"{key} is declared by {owner}")


class Deleting(GazetteError):
    """The resource was deleted: its spec is not to be written again."""


class Stale(GazetteError):
    """A newer generation of the resource has been written (this view is out of date)."""


@dataclass(frozen=True)
class Record:
    """A record as read: its decoded value ({} if absent) and mod revision (0 if absent)."""

    value: dict[str, Any]
    mod_revision: int


@dataclass(frozen=True)
class Written:
    """What a claim did: the spec's mod revision after it; whether it wrote the spec;
    whether this generation had been written here before (so a change is a repair of
    drift, not an update); the old key it removed (a rename)."""

    revision: int
    changed: bool
    repaired: bool
    moved_from: str | None


class Records:
    """The ownership records under `root`, and the guarded writes that use them."""

    def __init__(self, etcd: Etcd, root: str = OPERATOR_ROOT) -> None:
        self.etcd, self.root = etcd, root.rstrip("/")

    def item_key(self, key: str) -> str:
        return f"{self.root}/items{key}"

    def resource_key(self, owner: Owner) -> str:
        return f"{self.root}/resources/{owner.kind}/{owner.namespace}/{owner.name}"

    async def read(self, key: str) -> Record:
        _, kv = await self.etcd.get(key)
        if kv is None:
            return Record({}, 0)
        try:
            value = json.loads(kv.value)
        except ValueError:
            value = {}
        return Record(value if isinstance(value, dict) else {}, kv.mod_revision)

    async def spec(self, key: str) -> tuple[bytes, int]:
        _, kv = await self.etcd.get(key)
        return (kv.value, kv.mod_revision) if kv is not None else (b"", 0)

    async def owner_of(self, key: str) -> str:
        """The resource (namespace/name) owning the spec at `key`; "" if none."""
        return str((await self.read(self.item_key(key))).value.get("resource", ""))

    async def claim(self, key: str, value: bytes, owner: Owner) -> Written:
        """Make etcd hold `value` at `key` for `owner`, recording its ownership; the old
        key of a renamed resource is removed in the same transaction.

        `OwnedElsewhere` if another resource owns `key`; `Deleting` if `owner` was
        deleted; `Stale` if a newer generation of it was written; `Conflict` if a
        compared key changed meanwhile (nothing written)."""
        held = await self.read(self.resource_key(owner))
        mine = held.value.get("uid") == owner.uid
        if mine and held.value.get("deleted"):
            raise Deleting(f"{owner.resource} was deleted")
        written_generation = int(held.value.get("generation", 0)) if mine else 0
        if written_generation > owner.generation:
            raise Stale(f"{owner.resource}: generation {written_generation} was written, "
                        f"this is {owner.generation}")
        item = await self.read(self.item_key(key))
        other = item.value.get("resource")
        if other is not None and other != owner.resource:
            raise OwnedElsewhere(key, str(other))
        now, revision = await self.spec(key)
        txn = Txn().expect(self.resource_key(owner), held.mod_revision) \
            .expect(self.item_key(key), item.mod_revision).expect(key, revision)
        old = held.value.get("key") if not held.value.get("deleted") else None
        moved = None
        if isinstance(old, str) and old != key:
            moved = await self._remove(txn, old, owner)
        changed = now != value or not revision
        if changed:
            txn.put(key, value)
        if other is None:
            txn.put(self.item_key(key), _encode({"resource": owner.resource,
                                                 "kind": owner.kind}))
        record = {"key": key, "uid": owner.uid, "generation": owner.generation}
        if held.value != record:
            txn.put(self.resource_key(owner), _encode(record))
        repaired = changed and mine and old == key and written_generation == owner.generation
        if len(txn) == 0:
            return Written(revision, False, False, None)
        try:
            result = await txn.commit(self.etcd)
        except TxnConflict as err:
            raise Conflict(str(err)) from None
        return Written(result.revision if changed else revision, changed, repaired, moved)

    async def release(self, owner: Owner, keys: Iterable[str], ttl: int) -> list[str]:
        """Remove the specs `owner` owns among `keys` and the key its record names, with
        their records, and leave a tombstone for `ttl` seconds; the keys removed. A spec
        owned by another resource, or by none, is left alone."""
        held = await self.read(self.resource_key(owner))
        candidates = set(keys)
        if isinstance(held.value.get("key"), str) and not held.value.get("deleted"):
            candidates.add(held.value["key"])
        txn = Txn().expect(self.resource_key(owner), held.mod_revision)
        removed = [k for k in sorted(candidates) if await self._remove(txn, k, owner)]
        lease, _ = await self.etcd.lease_grant(ttl)
        txn.put(self.resource_key(owner), _encode({"uid": owner.uid, "deleted": True}), lease)
        try:
            await txn.commit(self.etcd)
        except TxnConflict as err:
            raise Conflict(str(err)) from None
        return removed

    async def _remove(self, txn: Txn, key: str, owner: Owner) -> str | None:
        """Add to `txn` the removal of `key` and its record if `owner` owns it."""
        item = await self.read(self.item_key(key))
        if item.value.get("resource") != owner.resource:
            return None
        txn.expect(self.item_key(key), item.mod_revision).delete(key).delete(self.item_key(key))
        return key


def _encode(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True).encode()
