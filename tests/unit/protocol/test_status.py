"""The protocol's statuses as enums: one member per code of the .proto, by name and
number, and what each says about retrying."""

from __future__ import annotations

import pytest

from gazette.pb import broker_pb2 as pb
from gazette.pb import consumer_pb2 as cpb
from gazette.protocol import ShardStatus, Status


def test_journal_statuses_are_the_protocols_codes() -> None:
    assert [s.value for s in Status] == list(pb.Status.keys())
    for status in Status:
        assert Status.of(status.code) is status
        assert status == status.name  # prints, logs and compares as its name


def test_shard_statuses_are_the_protocols_codes() -> None:
    assert [s.value for s in ShardStatus] == list(cpb.Status.keys())
    for status in ShardStatus:
        assert ShardStatus.of(status.code) is status


def test_an_unknown_code_is_refused() -> None:
    with pytest.raises(ValueError):
        Status.of(999)


def test_retriable_statuses_wrote_nothing_and_may_pass() -> None:
    changing = {s for s in Status if s.route_changing}
    assert changing == {Status.NO_JOURNAL_PRIMARY_BROKER, Status.NOT_JOURNAL_PRIMARY_BROKER,
                        Status.NOT_JOURNAL_BROKER, Status.INSUFFICIENT_JOURNAL_BROKERS,
                        Status.WRONG_ROUTE, Status.REPLICATION_FAILED}
    assert {s for s in Status if s.retriable} == changing | {Status.FRAGMENT_STORE_UNHEALTHY}
    for final in (Status.JOURNAL_NOT_FOUND, Status.WRONG_APPEND_OFFSET,
                  Status.REGISTER_MISMATCH, Status.NOT_ALLOWED, Status.APPEND_TOO_LARGE):
        assert not final.retriable
