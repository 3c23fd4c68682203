"""The connection a client holds to a broker or consumer member (its gRPC channel, retry
policy, request timeout and auth), and the checks of arguments every request shares."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import grpc

from gazette.auth import PLAIN, ClientAuth, auth_for, open_channel
from gazette.client.errors import Unavailable
from gazette.client.retry import (
    Backoff,
    RetryPolicy,
)
from gazette.client.wire import (
    CHANNEL_OPTIONS,
    parse_address,
)
from gazette.errors import ValidationError, short_repr
from gazette.labels import Selector

log = logging.getLogger(__name__)


def _selector(selector: Selector | str) -> Selector:
    if isinstance(selector, Selector):
        return selector
    if not isinstance(selector, str):
        raise ValidationError("selector", f"expected a Selector or str, got "
                              f"{type(selector).__name__}")
    return Selector.parse(selector) if selector.strip() else Selector()


def _not_str(content: object) -> None:
    if isinstance(content, str):
        raise ValidationError("content", "expected bytes, got str (encode it first)")


#: The protocol's offsets and times are int64: past this, protobuf fails with a bare
#: ValueError from deep inside a request.
MAX_INT64 = 2**63 - 1


def _check_offset(value: object, field: str, lo: int, hi: int = MAX_INT64) -> int:
    """`value` as an int in ``lo..hi``; ValidationError naming `field` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValidationError(field, f"expected an int >= {lo}, got {short_repr(value)}")
    if value > hi:
        raise ValidationError(field, f"must be at most {hi}, got {short_repr(value)}")
    return value


def checked_settings(retry: RetryPolicy | None, timeout: float,
                     channel_options: Sequence[tuple[str, Any]]
                     ) -> tuple[RetryPolicy, float, list[tuple[str, Any]]]:
    """A client's retry policy, deadline and channel options (ours, overridden by the
    caller's), each checked: what a journal client and a shard client both take."""
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise ValidationError("retry", f"expected a RetryPolicy, got {type(retry).__name__}")
    if not timeout > 0:
        raise ValidationError("timeout", f"must be > 0 seconds, got {timeout!r}")
    options = dict(CHANNEL_OPTIONS)
    options.update(dict(channel_options))
    return retry or RetryPolicy(), timeout, list(options.items())


def checked_auth(auth: object, address: str = "") -> ClientAuth:
    """A client's `ClientAuth` (None: plain text, no token), checked, as `address`'s
    scheme asks (`auth_for`: https:// is TLS)."""
    if auth is None:
        auth = PLAIN
    if not isinstance(auth, ClientAuth):
        raise ValidationError("auth", f"expected a ClientAuth, got {type(auth).__name__}")
    return auth_for(address, auth)


class Connection:
    """A client's connection to one server (a broker or a consumer member): its address,
    gRPC channel, retry policy, request deadline and TLS/token settings, and whether it
    was closed. The parts of a `JournalClient`, and a `ShardClient`, hold one."""

    def __init__(self, address: str, *, retry: RetryPolicy | None = None,
                 channel_options: Sequence[tuple[str, Any]] = (),
                 timeout: float = 30.0, auth: ClientAuth | None = None) -> None:
        self.address = parse_address(address)
        self.retry, self.timeout, self._options = checked_settings(retry, timeout,
                                                                   channel_options)
        #: TLS and the bearer token every call presents.
        self.auth = checked_auth(auth, address)
        self.channel = open_channel(self.address, self._options, self.auth)
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def channel_to(self, target: str) -> grpc.aio.Channel:
        """A channel to another server of the cluster (a journal's primary), with this
        connection's options and auth; its holder closes it."""
        return open_channel(target, self._options, self.auth)

    async def close(self) -> None:
        """Close the channel: RPCs still running end, and calls made afterwards fail
        (the clients raise `Unavailable`, code CLOSED)."""
        self._closed = True
        await self.channel.close(None)

    def backoff(self, op: str, journal: str = "") -> Backoff:
        """The retry budget of one operation; `Unavailable` (CLOSED) once closed."""
        if self._closed:
            raise Unavailable(op, self.address, "CLOSED", "the client was closed", journal)
        return Backoff(self.retry, op, self.address, journal, lambda: self._closed)


def _ended_early(journal: str) -> grpc.aio.AioRpcError:
    """A stream that ended where the protocol promises more: retried like a dropped
    connection (a broker shutting down ends streams this way)."""
    where = f" (reading {journal})" if journal else ""
    return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(),
                                grpc.aio.Metadata(), f"the broker ended the stream early{where}",
                                None)
