"""What a client presents: TLS toward the server, and its bearer token on every call.

`open_channel` is the one place the library opens gRPC channels to brokers and consumer
members. The token rides in each call's ``authorization`` metadata, added by a client
interceptor (the same with and without TLS).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import grpc

from gazette.auth.tls import TLSFiles
from gazette.errors import ValidationError

#: The metadata key of bearer tokens (lower case, as gRPC requires).
AUTHORIZATION = "authorization"


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    """The call metadata carrying `token` (none for an empty one)."""
    return ((AUTHORIZATION, f"Bearer {token}"),) if token else ()


@dataclass(frozen=True, slots=True)
class ClientAuth:
    """A client's TLS files (None: plain text) and bearer token ("": none), or where
    each call's token comes from (`token_source`: a member's own token, renewed, or
    the caller's whose request it serves)."""

    tls: TLSFiles | None = None
    token: str = ""
    token_source: Callable[[], str] | None = None

    def __post_init__(self) -> None:
        if self.token and (len(self.token) > 8192 or not self.token.isascii()
                           or any(c.isspace() for c in self.token)):
            raise ValidationError("auth.token", "not a token (expected one line of "
                                  "ASCII, as `gazctl auth issue` prints)")

    def current_token(self) -> str:
        return self.token_source() if self.token_source is not None else self.token


#: A client with neither TLS nor a token.
PLAIN = ClientAuth()

#: Address schemes that ask for TLS, and for plain text.
TLS_SCHEMES = ("https", "grpcs")
PLAIN_SCHEMES = ("http", "grpc")


def auth_for(address: str, auth: ClientAuth) -> ClientAuth:
    """`auth` as `address`'s scheme asks: ``https://`` and ``grpcs://`` are TLS (with
    `auth`'s files, else the system's CAs), so a token never goes in clear to a server
    named as TLS; ``http://`` and ``grpc://`` are plain text, refused when `auth` has
    TLS files (one of the two is a mistake). ``host:port`` is as `auth` says."""
    scheme, sep, _ = address.strip().partition("://")
    if not sep:
        return auth
    if scheme in TLS_SCHEMES and auth.tls is None:
        return replace(auth, tls=TLSFiles.system())
    if scheme in PLAIN_SCHEMES and auth.tls is not None:
        raise ValidationError("address", f"{address!r} is plain text ({scheme}://), but "
                              "TLS files are given: name it https:// (or host:port)")
    return auth


class _Token:
    """Adds the token to each call, unless the call carries one already (a member
    forwarding its caller's)."""

    def __init__(self, auth: ClientAuth) -> None:
        self._auth = auth

    def _details(self, details: Any) -> Any:
        metadata = tuple(details.metadata or ())
        if any(k == AUTHORIZATION for k, _ in metadata):
            return details
        token = self._auth.current_token()
        if not token:
            return details
        return grpc.aio.ClientCallDetails(details.method, details.timeout,
                                          grpc.aio.Metadata(*metadata, *bearer(token)),
                                          details.credentials, details.wait_for_ready)


# grpc.aio files each interceptor under the first kind it is an instance of: one class
# per kind of call.
class _UnaryUnary(_Token, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    async def intercept_unary_unary(self, continuation: Any, details: Any,
                                    request: Any) -> Any:
        return await continuation(self._details(details), request)


class _UnaryStream(_Token, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[type-arg]
    async def intercept_unary_stream(self, continuation: Any, details: Any,
                                     request: Any) -> Any:
        return await continuation(self._details(details), request)


class _StreamUnary(_Token, grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[type-arg]
    async def intercept_stream_unary(self, continuation: Any, details: Any,
                                     request_iterator: Any) -> Any:
        return await continuation(self._details(details), request_iterator)


class _StreamStream(_Token, grpc.aio.StreamStreamClientInterceptor):  # type: ignore[type-arg]
    async def intercept_stream_stream(self, continuation: Any, details: Any,
                                      request_iterator: Any) -> Any:
        return await continuation(self._details(details), request_iterator)


def open_channel(target: str, options: Sequence[tuple[str, Any]],
                 auth: ClientAuth | None = None) -> grpc.aio.Channel:
    """A channel to `target` with `auth`'s TLS (if any) and token (if any)."""
    auth = auth or PLAIN
    interceptors: Any = None
    if auth.token or auth.token_source:
        interceptors = [kind(auth) for kind in (_UnaryUnary, _UnaryStream, _StreamUnary,
                                                _StreamStream)]
    if auth.tls is not None:
        return grpc.aio.secure_channel(target, auth.tls.channel_credentials(),
                                       options=[*options, *_server_name(target, options)],
                                       interceptors=interceptors)
    return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)


def _server_name(target: str, options: Sequence[tuple[str, Any]]
                 ) -> list[tuple[str, str]]:
    """For a list of addresses (``ipv4:10.0.0.1:8080,10.0.0.2:8080``), the name their
    certificates are checked against: grpc would take the whole list for one host name
    and refuse every certificate. The first address's host stands for all of them: each
    server's certificate must cover it (one certificate for every member, as in tests).
    Names that resolve to several addresses (``dns:///brokers:8080``) have no such
    limit."""
    scheme, _, addresses = target.partition(":")
    if scheme not in ("ipv4", "ipv6") or "," not in addresses or any(
            name == "grpc.ssl_target_name_override" for name, _ in options):
        return []
    first = addresses.split(",", 1)[0]
    if first.startswith("["):  # ipv6 with a port: [::1]:8080
        host = first[1:first.find("]")]
    else:  # ipv4 host[:port], or ipv6 without a port
        host = first.rsplit(":", 1)[0] if scheme == "ipv4" and ":" in first else first
    return [("grpc.ssl_target_name_override", host)]
