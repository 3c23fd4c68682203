"""The state the operator shows for a shard, from its replicas' statuses in etcd."""

from __future__ import annotations

from gazette.protocol import ReplicaState, ReplicaStatus
from gazette_operator.sync import shard_state


def test_the_most_advanced_replica_is_shown_and_garbage_is_skipped() -> None:
    assert shard_state([]) == "pending"
    standby, primary = (ReplicaStatus(ReplicaState.STANDBY).encode(),
                        ReplicaStatus(ReplicaState.PRIMARY).encode())
    assert shard_state([standby, primary]) == "primary"
    failed = ReplicaStatus(ReplicaState.FAILED, "SourceError: gone").encode()
    assert shard_state([primary, b"\xff\xff not a status", failed]) == \
        "failed: SourceError: gone"
