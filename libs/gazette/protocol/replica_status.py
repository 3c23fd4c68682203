"""The state of one replica of a shard (one member's assignment of it), as kept in etcd.

States are ordered by progress (the values are the wire's, spaced so states can be added
between them): combining the statuses of a shard's replicas, the greatest wins, so a
shard with a FAILED replica is FAILED, else PRIMARY once its primary runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum

from gazette.errors import ValidationError
from gazette.pb import consumer_pb2 as cpb

#: Longest error text kept (an app's exception message can be anything).
MAX_ERROR_LEN = 2048


class ReplicaState(IntEnum):
    #: Assigned; not (yet) running.
    PENDING = cpb.ReplicaStatus.IDLE
    #: Rebuilding its store (recovery-log playback).
    RECOVERING = cpb.ReplicaStatus.BACKFILL
    #: Caught up; tailing as a hot standby (or waiting to be primary).
    STANDBY = cpb.ReplicaStatus.STANDBY
    #: The primary: processing the shard.
    PRIMARY = cpb.ReplicaStatus.PRIMARY
    #: Stopped by an error, which `ReplicaStatus.error` names.
    FAILED = cpb.ReplicaStatus.FAILED


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    state: ReplicaState = ReplicaState.PENDING
    error: str = ""
    #: While RECOVERING: bytes of the recovery log played, of those to play.
    played: int = 0
    to_play: int = 0

    def __post_init__(self) -> None:
        if len(self.error) > MAX_ERROR_LEN:
            object.__setattr__(self, "error", self.error[:MAX_ERROR_LEN - 3] + "...")

    def __str__(self) -> str:
        name = self.state.name.lower()
        if self.error:
            return f"{name}: {self.error}"
        if self.to_play:
            return f"{name}: played {_mib(self.played)} of {_mib(self.to_play)}"
        return name

    def to_pb(self) -> cpb.ReplicaStatus:
        return cpb.ReplicaStatus(code=int(self.state),  # type: ignore[arg-type]
                                 errors=[self.error] if self.error else [],
                                 played_bytes=self.played, to_play_bytes=self.to_play)

    @classmethod
    def from_pb(cls, msg: cpb.ReplicaStatus) -> ReplicaStatus:
        try:
            state = ReplicaState(msg.code)
        except ValueError:
            raise ValidationError("status.code", f"unknown replica state {msg.code}") from None
        return cls(state, "; ".join(msg.errors), max(msg.played_bytes, 0),
                   max(msg.to_play_bytes, 0))

    def encode(self) -> bytes:
        return self.to_pb().SerializeToString()

    @classmethod
    def decode(cls, value: bytes) -> ReplicaStatus:
        return cls.from_pb(cpb.ReplicaStatus.FromString(value))


def combined_status(statuses: Iterable[ReplicaStatus]) -> ReplicaStatus:
    """The status of a shard from its replicas': the greatest state (PENDING if none)."""
    return max(statuses, key=lambda s: s.state, default=ReplicaStatus())


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
