"""Retries of transport failures: which gRPC codes are worth retrying, jittered backoff,
and the errors a failure becomes once it is not retried.

A broker status that says the journal's route is changing (`RETRYABLE_STATUSES`: a
broker died, joined or is draining) is asked again every `ROUTE_RETRY_SECONDS` at most,
for as long as the policy's retries would wait in all (`RetryPolicy.budget`): the route
settles when etcd expires a dead member's lease and the allocator moves its journals,
which a backoff grown to seconds would notice only seconds late (a producer stalled 12
to 14.5 s through a failover of about 4 s).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc

from gazette.client.errors import BrokerError, Unavailable
from gazette.client.metrics import RETRIES
from gazette.errors import ValidationError
from gazette.protocol.status import Status

log = logging.getLogger(__name__)

#: Codes of a lost connection, a broker restarting or shutting down, or a timeout: the
#: request may succeed if made again. Anything else (INVALID_ARGUMENT, DATA_LOSS,
#: UNIMPLEMENTED, ...) would fail the same way again.
RETRYABLE = frozenset({
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED,
    grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
})


@dataclass(frozen=True)
class RetryPolicy:
    """`attempts` tries in all (1: never retry). The first retry waits `initial_delay`
    seconds, each next one `multiplier` times longer up to `max_delay`, each scaled by a
    random factor in [1 - jitter, 1 + jitter] so that many clients cut off together do
    not come back in lockstep. Defaults ride out a broker restart of about 20 s."""

    attempts: int = 10
    initial_delay: float = 0.1
    max_delay: float = 5.0
    multiplier: float = 2.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) \
                or self.attempts < 1:
            raise ValidationError("retry.attempts", f"must be an int >= 1, got "
                                  f"{self.attempts!r}")
        if not 0 <= self.initial_delay <= self.max_delay:
            raise ValidationError("retry.initial_delay",
                                  "must be >= 0 and not above retry.max_delay")
        if self.multiplier < 1:
            raise ValidationError("retry.multiplier", "must be >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValidationError("retry.jitter", "must be in [0, 1]")

    def delays(self) -> Iterator[float]:
        """The waits before each retry (`attempts` - 1 of them)."""
        delay = self.initial_delay
        for _ in range(self.attempts - 1):
            yield delay * random.uniform(1 - self.jitter, 1 + self.jitter)
            delay = min(delay * self.multiplier, self.max_delay)

    def budget(self) -> float:
        """Seconds its retries wait in all (without jitter): how long a journal's route
        may go on changing before the client gives up (about 21 s by default)."""
        total, delay = 0.0, self.initial_delay
        for _ in range(self.attempts - 1):
            total += delay
            delay = min(delay * self.multiplier, self.max_delay)
        return total


def rpc_error(err: grpc.aio.AioRpcError, journal: str = "") -> Exception:
    """The error a non-retryable gRPC failure becomes: INVALID_ARGUMENT a
    `ValidationError` naming the field the broker named, anything else a `BrokerError`
    carrying the code name."""
    details = err.details() or ""
    if err.code() == grpc.StatusCode.INVALID_ARGUMENT:
        field, sep, reason = details.partition(": ")
        if sep and " " not in field:
            return ValidationError(field, reason)
        return ValidationError("request", details)
    return BrokerError(err.code().name, journal, details)


#: Broker statuses of an append or read that a moment later may succeed: the journal's
#: route is changing (a broker died, joined or is draining). Nothing was written.
#: (`Status.route_changing` says it of one status.)
RETRYABLE_STATUSES = frozenset(s for s in Status if s.route_changing)
#: The longest wait before asking again about a journal whose route is changing.
ROUTE_RETRY_SECONDS = 0.25
#: How often those retries are logged (at INFO; the others at DEBUG).
ROUTE_LOG_SECONDS = 5.0


class Backoff:
    """One operation's retry budget: `wait` sleeps before the next try, or raises when
    the failure is not retryable or the budget is spent. `reset` after progress (a
    reader that got content starts a fresh budget)."""

    def __init__(self, policy: RetryPolicy, op: str, address: str, journal: str = "",
                 closed: Callable[[], bool] = lambda: False) -> None:
        self.policy, self.op, self.address, self.journal = policy, op, address, journal
        self._closed = closed
        self.attempts = 1
        self._delays = policy.delays()
        self._route_since: float | None = None  # the first refusal of a changing route
        self._route_said = -ROUTE_LOG_SECONDS  # when a retry of one was last logged

    def reset(self) -> None:
        self.attempts = 1
        self._delays = self.policy.delays()
        self._route_since = None

    def retryable(self, err: grpc.aio.AioRpcError) -> bool:
        return err.code() in RETRYABLE

    async def wait_status(self, status: Status | str) -> None:
        """As `wait`, for a broker status of `RETRYABLE_STATUSES` (the route is
        changing): waits at most `ROUTE_RETRY_SECONDS`; raises `BrokerError` (nothing
        was written) once the policy's `budget` of time is spent."""
        now = asyncio.get_running_loop().time()
        if self._route_since is None:
            self._route_since = now
        policy, waited = self.policy, now - self._route_since
        delay = min(policy.initial_delay * policy.multiplier ** min(self.attempts - 1, 32),
                    ROUTE_RETRY_SECONDS) * random.uniform(1 - policy.jitter, 1 + policy.jitter)
        if self._closed() or waited + delay > policy.budget():
            raise BrokerError(status, self.journal, f"nothing was written; still so after "
                              f"{self.attempts} attempts in {waited:.1f}s")
        self.attempts += 1
        RETRIES.labels(self.op).inc()
        # Asked again a few times a second: said once, then every ROUTE_LOG_SECONDS.
        said = now - self._route_said >= ROUTE_LOG_SECONDS
        if said:
            self._route_said = now
        log.log(logging.INFO if said else logging.DEBUG,
                "%s%s via %s: %s (for %.1fs); retry %d in %.2fs", self.op,
                f" of {self.journal}" if self.journal else "", self.address, status,
                waited, self.attempts - 1, delay)
        await asyncio.sleep(delay)

    async def wait(self, err: grpc.aio.AioRpcError) -> None:
        if self._closed():
            raise Unavailable(self.op, self.address, "CLOSED", "the client was closed",
                              self.journal) from err
        if not self.retryable(err):
            raise rpc_error(err, self.journal) from err
        delay = next(self._delays, None)
        if delay is None:
            raise Unavailable(self.op, self.address, err.code().name, err.details() or "",
                              self.journal, self.attempts) from err
        self.attempts += 1
        RETRIES.labels(self.op).inc()
        log.info("%s%s via %s failed (%s: %s); retry %d in %.2fs", self.op,
                 f" of {self.journal}" if self.journal else "", self.address,
                 err.code().name, err.details(), self.attempts - 1, delay)
        await asyncio.sleep(delay)
