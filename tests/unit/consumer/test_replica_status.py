"""Replica statuses: their wire form, their order, and how a shard's replicas combine."""

from __future__ import annotations

import pytest

from gazette.errors import ValidationError
from gazette.pb import consumer_pb2 as cpb
from gazette.protocol import ReplicaState, ReplicaStatus, combined_status
from gazette.protocol.replica_status import MAX_ERROR_LEN


def test_round_trips_through_the_wire_codes() -> None:
    for state in ReplicaState:
        status = ReplicaStatus(state, "boom" if state == ReplicaState.FAILED else "")
        assert ReplicaStatus.decode(status.encode()) == status
    assert ReplicaStatus(ReplicaState.RECOVERING).to_pb().code == cpb.ReplicaStatus.BACKFILL
    assert ReplicaStatus(ReplicaState.PENDING).to_pb().code == cpb.ReplicaStatus.IDLE


def test_recovery_progress_goes_on_the_wire_and_shows() -> None:
    status = ReplicaStatus(ReplicaState.RECOVERING, played=3 << 20, to_play=12 << 20)
    assert ReplicaStatus.decode(status.encode()) == status
    assert str(status) == "recovering: played 3.0 MiB of 12.0 MiB"
    assert ReplicaStatus.from_pb(cpb.ReplicaStatus(code=cpb.ReplicaStatus.BACKFILL,
                                                   played_bytes=-5)).played == 0


def test_an_unknown_code_is_named() -> None:
    with pytest.raises(ValidationError, match=r"status\.code: unknown replica state 7"):
        ReplicaStatus.from_pb(cpb.ReplicaStatus(code=7))  # type: ignore[arg-type]


def test_the_greatest_state_wins_and_shows_its_error() -> None:
    assert combined_status([]) == ReplicaStatus()
    primary, failed = ReplicaStatus(ReplicaState.PRIMARY), ReplicaStatus(
        ReplicaState.FAILED, "ValueError: bad")
    assert combined_status([ReplicaStatus(ReplicaState.STANDBY), primary]) == primary
    assert str(combined_status([primary, failed])) == "failed: ValueError: bad"
    assert str(primary) == "primary"


def test_a_huge_error_is_cut() -> None:
    status = ReplicaStatus(ReplicaState.FAILED, "x" * 100_000)
    assert len(status.error) == MAX_ERROR_LEN and status.error.endswith("...")
