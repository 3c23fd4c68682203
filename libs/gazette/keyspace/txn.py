"""etcd transactions guarded by mod revisions: optimistic concurrency for specs.

A writer reads a key at some mod revision, decides, and writes only if the key is still at
that revision (0 meaning "must not exist"). When another writer got there first, the
transaction fails cleanly with `TxnConflict`, which names each stale key with the
revision it expected and the one it found. A put under a lease that has just expired (a
member that died since the writer read its key) is a conflict too: the writer's view was
stale, and the keys of that lease are gone at the conflict's revision.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aetcd import rpc

from gazette.errors import GazetteError
from gazette.keyspace.etcd import Etcd, KeyValue, LeaseNotFound


class TxnConflict(GazetteError):
    """A compared key was not at the expected mod revision, or a lease a put names no
    longer exists; nothing was written. By `revision` etcd had the change that made the
    writer's view stale."""

    def __init__(self, stale: list[tuple[str, int, int]], revision: int,
                 why: str = "") -> None:
        self.stale = stale  # (key, expected mod revision, actual mod revision; 0 = absent)
        self.revision = revision
        detail = why or "; ".join(
            f"{key}: expected {'absent' if want == 0 else f'mod revision {want}'}, "
            f"found {'absent' if got == 0 else f'mod revision {got}'}"
            for key, want, got in stale
        ) or "a compared key changed"
        super().__init__(f"etcd transaction failed at revision {revision}: {detail}")


@dataclass(frozen=True, slots=True)
class TxnResult:
    revision: int


@dataclass
class Txn:
    """Build with `expect` / `put` / `delete`, then `await txn.commit(etcd)`."""

    _expected: dict[str, int] = field(default_factory=dict)
    _ops: list[Any] = field(default_factory=list)

    def expect(self, key: str, mod_revision: int) -> Txn:
        """Require `key` at `mod_revision` (0: the key must not exist)."""
        if mod_revision < 0:
            raise ValueError(f"mod revision of {key!r} must be >= 0, got {mod_revision}")
        self._expected[key] = mod_revision
        return self

    def put(self, key: str, value: bytes, lease: int = 0) -> Txn:
        self._ops.append(rpc.RequestOp(request_put=rpc.PutRequest(
            key=key.encode(), value=value, lease=lease)))
        return self

    def delete(self, key: str) -> Txn:
        self._ops.append(rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(
            key=key.encode())))
        return self

    def __len__(self) -> int:
        return len(self._ops)

    async def commit(self, etcd: Etcd) -> TxnResult:
        """Apply every op atomically if every expectation holds; else raise `TxnConflict`."""
        compares = [
            rpc.Compare(key=key.encode(), target=rpc.Compare.MOD, result=rpc.Compare.EQUAL,
                        mod_revision=rev)
            for key, rev in self._expected.items()
        ]
        # On failure, read the compared keys back so the error can say what changed.
        failure = [rpc.RequestOp(request_range=rpc.RangeRequest(key=key.encode()))
                   for key in self._expected]
        try:
            resp = await etcd.txn(compares, self._ops, failure)
        except LeaseNotFound as err:
            # Expired or revoked since the writer read its keys: they are gone by now.
            raise TxnConflict([], await etcd.revision(),
                              f"a lease one of its puts names no longer exists ({err})"
                              ) from err
        revision = int(resp.header.revision)
        if resp.succeeded:
            return TxnResult(revision)
        stale = []
        for (key, want), op in zip(self._expected.items(), resp.responses, strict=True):
            kvs = op.response_range.kvs
            got = KeyValue.from_pb(kvs[0]).mod_revision if kvs else 0
            if got != want:
                stale.append((key, want, got))
        raise TxnConflict(stale, revision)
